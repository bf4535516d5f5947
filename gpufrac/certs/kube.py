"""`certs.cluster.Cluster` over the official kubernetes client: the rotation's Kubernetes edge."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client

from gpufrac.certs.cluster import MUTATING
from gpufrac.kube.client import load_api_client, translated
from gpufrac.kube.errors import ConflictError, NotFoundError


class KubeCluster:
    """`Cluster` over the official kubernetes client."""

    def __init__(self, kubeconfig: str | None = None) -> None:
        api_client = load_api_client(kubeconfig)
        self._core = client.CoreV1Api(api_client)
        self._admission = client.AdmissionregistrationV1Api(api_client)

    @staticmethod
    def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with translated(getattr(fn, "__name__", "calling the API")):
            return fn(*args, **kwargs)

    def read_secret(self, namespace: str, name: str) -> tuple[dict[str, str], str] | None:
        try:
            s = self._call(self._core.read_namespaced_secret, name, namespace)
        except NotFoundError:
            return None
        return dict(s.data or {}), s.metadata.resource_version

    def _secret(self, name: str, data: dict[str, str], resource_version: str | None = None) -> Any:
        return client.V1Secret(
            metadata=client.V1ObjectMeta(
                name=name, resource_version=resource_version,
                labels={"app.kubernetes.io/part-of": "gpufrac", "app.kubernetes.io/component": "certs"},
            ),
            type="kubernetes.io/tls", data=data,
        )

    def create_secret(self, namespace: str, name: str, data: dict[str, str]) -> None:
        self._call(self._core.create_namespaced_secret, namespace, self._secret(name, data))

    def replace_secret(self, namespace: str, name: str, data: dict[str, str], resource_version: str) -> None:
        # Read-modify-write under resourceVersion: a concurrent run gets a 409 and starts over.
        body = self._call(self._core.read_namespaced_secret, name, namespace)
        if body.metadata.resource_version != resource_version:
            raise ConflictError("secret changed during the run")
        body.data = data
        self._call(self._core.replace_namespaced_secret, name, namespace, body)

    def read_webhooks(self, kind: str, name: str) -> list[tuple[str, str]]:
        read = (self._admission.read_mutating_webhook_configuration if kind == MUTATING
                else self._admission.read_validating_webhook_configuration)
        obj = self._call(read, name)
        return [
            (w.name, (w.client_config.ca_bundle or "") if w.client_config else "") for w in obj.webhooks or []
        ]

    def set_ca_bundle(self, kind: str, name: str, index: int, webhook: str, ca_bundle: str) -> None:
        patch = (self._admission.patch_mutating_webhook_configuration if kind == MUTATING
                 else self._admission.patch_validating_webhook_configuration)
        # JSON patch; `test` makes sure the index still names the same webhook.
        body = [
            {"op": "test", "path": f"/webhooks/{index}/name", "value": webhook},
            {"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": ca_bundle},
        ]
        self._call(patch, name, body)
