"""The DRA driver's Kubernetes API calls (edge): read a ResourceClaim, publish the node's ResourceSlices.

resource.k8s.io/v1 through the client's CustomObjectsApi (the generic path for a group/version/plural), so the
objects travel as plain JSON dicts whatever typed models the installed client has. Errors are `gpufrac.kube.errors`.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

from gpufrac.agent.dra.decide.slices import DRIVER
from gpufrac.kube.client import load_api_client, translated
from gpufrac.kube.errors import NotFoundError

GROUP = "resource.k8s.io"
VERSION = "v1"


class DraKube:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.objects = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)

    @classmethod
    def from_config(cls, kubeconfig: str | None) -> DraKube:
        return cls(load_api_client(kubeconfig))

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """None when it is gone."""
        try:
            with translated(f"reading ResourceClaim {namespace}/{name}"):
                found: dict[str, Any] = self.objects.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, "resourceclaims", name)
        except NotFoundError:
            return None
        return found

    def _node_metadata(self, node: str) -> dict[str, Any]:
        """Every agent asks every few seconds, so from the API server's watch cache (a list at resourceVersion 0),
        never a read of etcd."""
        with translated(f"reading node {node}"):
            found = self.core.list_node(field_selector=f"metadata.name={node}", resource_version="0",
                                        _preload_content=False)
        items = json.loads(found.data).get("items") or []
        if not items:
            raise NotFoundError(f"reading node {node}: the API server has no node {node}", 404)
        metadata: dict[str, Any] = items[0].get("metadata") or {}
        return metadata

    def node_labels(self, node: str) -> dict[str, str]:
        """The node's labels (its front door is one of them)."""
        labels: dict[str, str] = self._node_metadata(node).get("labels") or {}
        return labels

    def node_uid(self, node: str) -> str:
        """The node's UID: its slices' owner."""
        return str(self._node_metadata(node).get("uid") or "")

    def list_slices(self, node: str) -> list[dict[str, Any]]:
        """This driver's slices of one node."""
        with translated(f"listing the ResourceSlices of driver {DRIVER} on node {node}"):
            found = self.objects.list_cluster_custom_object(
                GROUP, VERSION, "resourceslices", field_selector=f"spec.driver={DRIVER},spec.nodeName={node}")
        items: list[dict[str, Any]] = found.get("items") or []
        return items

    def create_slice(self, body: dict[str, Any]) -> None:
        with translated(f"creating ResourceSlice {body['metadata']['name']}"):
            self.objects.create_cluster_custom_object(GROUP, VERSION, "resourceslices", body)

    def replace_slice(self, body: dict[str, Any], resource_version: str) -> None:
        """Optimistic: a 409 (someone changed it since it was read) is a ConflictError."""
        name = body["metadata"]["name"]
        body = {**body, "metadata": {**body["metadata"], "resourceVersion": resource_version}}
        with translated(f"replacing ResourceSlice {name}"):
            self.objects.replace_cluster_custom_object(GROUP, VERSION, "resourceslices", name, body)

    def delete_slice(self, name: str) -> None:
        try:
            with translated(f"deleting ResourceSlice {name}"):
                self.objects.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", name)
        except NotFoundError:
            pass
