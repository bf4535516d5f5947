"""What the certificate rotation needs of a cluster: the `Cluster` port that `rotation.reconcile` uses and
`kube.KubeCluster` (or a test's in-memory fake) implements, so neither side imports the other."""

from __future__ import annotations

from typing import Protocol

MUTATING = "MutatingWebhookConfiguration"
VALIDATING = "ValidatingWebhookConfiguration"
WEBHOOK_CONFIGURATION_KINDS = (MUTATING, VALIDATING)


class Cluster(Protocol):
    def read_secret(self, namespace: str, name: str) -> tuple[dict[str, str], str] | None:
        """(data, resourceVersion), or None when the Secret does not exist."""

    def create_secret(self, namespace: str, name: str, data: dict[str, str]) -> None: ...

    def replace_secret(
        self, namespace: str, name: str, data: dict[str, str], resource_version: str
    ) -> None: ...

    def read_webhooks(self, kind: str, name: str) -> list[tuple[str, str]]:
        """[(webhook name, caBundle base64 or "")] of one of WEBHOOK_CONFIGURATION_KINDS."""

    def set_ca_bundle(self, kind: str, name: str, index: int, webhook: str, ca_bundle: str) -> None: ...
