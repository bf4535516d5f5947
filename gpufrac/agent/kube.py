"""The Kubernetes API calls the agent makes (edge). Objects travel as plain JSON dicts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines
from urllib3.exceptions import HTTPError as TransportError

from gpufrac.agent.errors import KubeApiError
from gpufrac.core.contract import FRACTIONAL_LABEL, FRACTIONAL_VALUE

STRATEGIC = "application/strategic-merge-patch+json"
# what the client raises when the API server cannot be reached at all (down, restarting): not an ApiException
UNREACHABLE = (TransportError, OSError)
FIELD_MANAGER = "gpufrac-agent"


class GoneError(KubeApiError):
    """The watch's resourceVersion is too old (410 Gone): relist."""


def pod_selectors(node: str) -> dict[str, str]:
    return {"label_selector": f"{FRACTIONAL_LABEL}={FRACTIONAL_VALUE}", "field_selector": f"spec.nodeName={node}"}


class KubeClient:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)

    @classmethod
    def from_config(cls, kubeconfig: str | None) -> KubeClient:
        if kubeconfig:
            return cls(config.new_client_from_config(config_file=kubeconfig))
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return cls(client.ApiClient())

    # ---- node ----

    def patch_node_labels(self, node: str, labels: dict[str, str]) -> None:
        try:
            self.core.patch_node(
                node, {"metadata": {"labels": labels}}, field_manager=FIELD_MANAGER, _content_type=STRATEGIC
            )
        except ApiException as err:
            raise KubeApiError(f"labelling node {node}: {err.status} {err.reason}") from err
        except UNREACHABLE as err:
            raise KubeApiError(f"labelling node {node}: {err}") from err

    def patch_node_condition(self, node: str, condition: dict[str, Any]) -> None:
        try:
            self.core.patch_node_status(
                node,
                {"status": {"conditions": [condition]}},
                field_manager=FIELD_MANAGER,
                _content_type=STRATEGIC,
            )
        except ApiException as err:
            raise KubeApiError(
                f"setting the {condition['type']} condition on node {node}: {err.status} {err.reason}"
            ) from err
        except UNREACHABLE as err:
            raise KubeApiError(f"setting the {condition['type']} condition on node {node}: {err}") from err

    # ---- events and eviction ----

    def create_event(self, namespace: str, body: dict[str, Any]) -> bool:
        try:
            self.core.create_namespaced_event(namespace, body, field_manager=FIELD_MANAGER)
        except ApiException as err:
            if err.status == 409:
                return False
            raise KubeApiError(
                f"creating event {body['metadata']['name']}: {err.status} {err.reason}"
            ) from err
        except UNREACHABLE as err:
            raise KubeApiError(f"creating event {body['metadata']['name']}: {err}") from err
        return True

    def evict_pod(self, namespace: str, name: str) -> bool:
        """False when the eviction is refused for now (a PodDisruptionBudget: 429) or the pod is gone."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        try:
            self.core.create_namespaced_pod_eviction(name, namespace, body)
        except ApiException as err:
            if err.status in (404, 429):
                return False
            raise KubeApiError(f"evicting pod {namespace}/{name}: {err.status} {err.reason}") from err
        except UNREACHABLE as err:
            raise KubeApiError(f"evicting pod {namespace}/{name}: {err}") from err
        return True

    # ---- pods ----

    def list_pods(self, node: str) -> tuple[list[dict[str, Any]], str]:
        try:
            resp = self.core.list_pod_for_all_namespaces(_preload_content=False, **pod_selectors(node))
        except ApiException as err:
            raise KubeApiError(f"listing pods on {node}: {err.status} {err.reason}") from err
        except UNREACHABLE as err:
            raise KubeApiError(f"listing pods on {node}: {err}") from err
        body = json.loads(resp.data)
        return body.get("items") or [], body["metadata"].get("resourceVersion", "")

    def watch_pods(self, node: str, resource_version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]:
        """Raw watch events; raises GoneError on 410 (as a status or an ERROR event)."""
        try:
            resp = self.core.list_pod_for_all_namespaces(
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout_seconds,
                _preload_content=False,
                _request_timeout=(10, timeout_seconds + 30),
                **pod_selectors(node),
            )
        except ApiException as err:
            if err.status == 410:
                raise GoneError("resourceVersion too old") from err
            raise KubeApiError(f"watching pods on {node}: {err.status} {err.reason}") from err
        try:
            for line in iter_resp_lines(resp):
                if not line or not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    if status.get("code") == 410:
                        raise GoneError(status.get("message", "resourceVersion too old"))
                    raise KubeApiError(f"pod watch error: {status.get('message', status)}")
                yield event
        finally:
            resp.close()
            resp.release_conn()
