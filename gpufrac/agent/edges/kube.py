"""The Kubernetes API calls the agent makes (edge). Objects travel as plain JSON dicts.

Errors are `gpufrac.kube.errors`: what the callers branch on (409, 404/429, 410) is an error type, not a status.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from gpufrac.agent.decide.gangs import POD_GROUP_API
from gpufrac.agent.decide.model import EvictionOutcome
from gpufrac.core.contract import FRACTIONAL_LABEL, FRACTIONAL_VALUE
from gpufrac.kube.client import load_api_client, translated
from gpufrac.kube.errors import ApiError, ConflictError, GoneError, NotFoundError, TooManyRequestsError

STRATEGIC = "application/strategic-merge-patch+json"
FIELD_MANAGER = "gpufrac-agent"


def _event_name(body: dict[str, Any]) -> str:
    metadata = body["metadata"]
    return str(metadata.get("name") or metadata.get("generateName", "") + "*")


def pod_selectors(node: str) -> dict[str, str]:
    return {"label_selector": f"{FRACTIONAL_LABEL}={FRACTIONAL_VALUE}", "field_selector": f"spec.nodeName={node}"}


class KubeClient:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.apps = client.AppsV1Api(api_client)

    @classmethod
    def from_config(cls, kubeconfig: str | None) -> KubeClient:
        return cls(load_api_client(kubeconfig))

    # ---- node ----

    def node_labels(self, node: str) -> dict[str, str]:
        """The node's labels, read once (the back-offs an earlier agent left on it)."""
        with translated(f"reading node {node}"):
            resp = self.core.read_node(node, _preload_content=False)
        labels: dict[str, str] = (json.loads(resp.data).get("metadata") or {}).get("labels") or {}
        return labels

    def patch_node_labels(self, node: str, labels: Mapping[str, str | None]) -> None:
        with translated(f"labelling node {node}"):
            self.core.patch_node(
                node, {"metadata": {"labels": labels}}, field_manager=FIELD_MANAGER, _content_type=STRATEGIC
            )

    def patch_node_condition(self, node: str, condition: dict[str, Any]) -> None:
        with translated(f"setting the {condition['type']} condition on node {node}"):
            self.core.patch_node_status(
                node,
                {"status": {"conditions": [condition]}},
                field_manager=FIELD_MANAGER,
                _content_type=STRATEGIC,
            )

    # ---- withdrawal (`gpufrac agent-withdraw`, the chart's pre-delete hook) ----

    def list_nodes(self) -> list[dict[str, Any]]:
        with translated("listing nodes"):
            resp = self.core.list_node(_preload_content=False)
        items: list[dict[str, Any]] = json.loads(resp.data).get("items") or []
        return items

    def remove_node_labels(self, node: str, keys: tuple[str, ...]) -> None:
        with translated(f"removing labels {', '.join(keys)} from node {node}"):
            self.core.patch_node(node, {"metadata": {"labels": dict.fromkeys(keys)}},  # null removes a label
                                 field_manager=FIELD_MANAGER, _content_type=STRATEGIC)

    def remove_node_conditions(self, node: str, condition_types: tuple[str, ...]) -> None:
        """Conditions merge on `type`: `$patch: delete` removes each one, whoever wrote the others."""
        body = {"status": {"conditions": [{"type": t, "$patch": "delete"} for t in condition_types]}}
        with translated(f"removing conditions {', '.join(condition_types)} from node {node}"):
            self.core.patch_node_status(node, body, field_manager=FIELD_MANAGER, _content_type=STRATEGIC)

    def remove_node_annotations(self, node: str, keys: tuple[str, ...]) -> None:
        with translated(f"removing annotations {', '.join(keys)} from node {node}"):
            self.core.patch_node(node, {"metadata": {"annotations": dict.fromkeys(keys)}},
                                 field_manager=FIELD_MANAGER, _content_type=STRATEGIC)

    def delete_daemonset(self, namespace: str, name: str) -> bool:
        """False when it is gone already. Its pods are deleted in the background (each gets its grace period)."""
        try:
            with translated(f"deleting daemonset {namespace}/{name}"):
                self.apps.delete_namespaced_daemon_set(name, namespace, propagation_policy="Background")
        except NotFoundError:
            return False
        return True

    def delete_secret(self, namespace: str, name: str) -> bool:
        """False when it is gone already."""
        try:
            with translated(f"deleting secret {namespace}/{name}"):
                self.core.delete_namespaced_secret(name, namespace)
        except NotFoundError:
            return False
        return True

    def count_pods(self, namespace: str, label_selector: str) -> int:
        """Pods that still exist, terminating ones included."""
        with translated(f"listing pods {label_selector} in {namespace}"):
            resp = self.core.list_namespaced_pod(namespace, label_selector=label_selector, _preload_content=False)
        return len(json.loads(resp.data).get("items") or [])

    # ---- the MPS pods' roll (`gpufrac mps-roll`) ----

    def read_daemonset(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            with translated(f"reading daemonset {namespace}/{name}"):
                resp = self.apps.read_namespaced_daemon_set(name, namespace, _preload_content=False)
        except NotFoundError:
            return None
        daemonset: dict[str, Any] = json.loads(resp.data)
        return daemonset

    def deployment_version(self, namespace: str, name: str) -> str | None:
        """The Deployment's `app.kubernetes.io/version` label (the chart's appVersion); None: no such Deployment."""
        try:
            with translated(f"reading deployment {namespace}/{name}"):
                resp = self.apps.read_namespaced_deployment(name, namespace, _preload_content=False)
        except NotFoundError:
            return None
        labels = (json.loads(resp.data).get("metadata") or {}).get("labels") or {}
        version = labels.get("app.kubernetes.io/version")
        return str(version) if version else None

    def daemonset_present(self, namespace: str, name: str) -> bool:
        """True while it exists and is not being deleted (the uninstall's hook deletes the agents' DaemonSet)."""
        found = self.read_daemonset(namespace, name)
        return found is not None and not (found.get("metadata") or {}).get("deletionTimestamp")

    def current_revision(self, namespace: str, daemonset: Mapping[str, Any]) -> str:
        """The controller-revision-hash of the DaemonSet's newest ControllerRevision: what its pods made from the
        current template carry."""
        uid = daemonset["metadata"]["uid"]
        labels = daemonset["spec"]["selector"].get("matchLabels") or {}
        with translated(f"listing the controller revisions of daemonset {namespace}/{daemonset['metadata']['name']}"):
            resp = self.apps.list_namespaced_controller_revision(
                namespace, label_selector=",".join(f"{k}={v}" for k, v in labels.items()), _preload_content=False)
        owned = [r for r in json.loads(resp.data).get("items") or []
                 if any(o.get("uid") == uid for o in r["metadata"].get("ownerReferences") or [])]
        if not owned:
            raise NotFoundError(f"daemonset {namespace}/{daemonset['metadata']['name']} has no controller revision")
        newest = max(owned, key=lambda r: int(r.get("revision", 0)))
        return str(newest["metadata"].get("labels", {}).get("controller-revision-hash", ""))

    def list_namespaced_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        with translated(f"listing pods {label_selector} in {namespace}"):
            resp = self.core.list_namespaced_pod(namespace, label_selector=label_selector, _preload_content=False)
        items: list[dict[str, Any]] = json.loads(resp.data).get("items") or []
        return items

    def set_unschedulable(self, node: str, unschedulable: bool) -> None:
        """Cordon (True) or uncordon (False), as kubectl does."""
        with translated(f"{'cordoning' if unschedulable else 'uncordoning'} node {node}"):
            self.core.patch_node(node, {"spec": {"unschedulable": unschedulable or None}},
                                 _content_type=STRATEGIC)

    def delete_pod(self, namespace: str, name: str) -> bool:
        """False when it is gone already."""
        try:
            with translated(f"deleting pod {namespace}/{name}"):
                self.core.delete_namespaced_pod(name, namespace)
        except NotFoundError:
            return False
        return True

    # ---- events and eviction ----

    def create_event(self, namespace: str, body: dict[str, Any]) -> bool:
        """False when the event exists already (its name is derived from the violation)."""
        try:
            with translated(f"creating event {_event_name(body)}"):
                self.core.create_namespaced_event(namespace, body, field_manager=FIELD_MANAGER)
        except ConflictError:
            return False
        return True

    def evict_pod(self, namespace: str, name: str) -> bool:
        """False when the eviction is refused for now (a PodDisruptionBudget: 429) or the pod is gone."""
        return self.request_eviction(namespace, name)[0] is EvictionOutcome.EVICTED

    def request_eviction(self, namespace: str, name: str, *, uid: str = "",
                         grace_seconds: int | None = None) -> tuple[EvictionOutcome, str]:
        """Evict through the Eviction API, which honours PodDisruptionBudgets: the outcome and the API server's
        words when it refused. With `uid`, only the pod of that UID (a precondition: a pod of the same name made
        since is a 409, a KubeError); with `grace_seconds`, its grace period instead of its own. Other errors raise
        KubeError."""
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        options: dict[str, Any] = {}
        if uid:
            options["preconditions"] = {"uid": uid}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        if options:
            body["deleteOptions"] = options
        try:
            with translated(f"evicting pod {namespace}/{name}"):
                self.core.create_namespaced_pod_eviction(name, namespace, body)
        except NotFoundError as err:
            return EvictionOutcome.GONE, str(err)
        except TooManyRequestsError as err:
            return EvictionOutcome.BLOCKED, str(err)
        return EvictionOutcome.EVICTED, ""

    # ---- pods ----

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod as the API server has it now; None when it does not exist."""
        try:
            with translated(f"reading pod {namespace}/{name}"):
                resp = self.core.read_namespaced_pod(name, namespace, _preload_content=False)
        except NotFoundError:
            return None
        pod: dict[str, Any] = json.loads(resp.data)
        return pod

    def get_pod_group(self, namespace: str, name: str) -> dict[str, Any] | None:
        """KAI's PodGroup (gangs.POD_GROUP_API); None when there is none (or KAI's CRD is not installed)."""
        group, version, plural = POD_GROUP_API
        try:
            with translated(f"reading PodGroup {namespace}/{name}"):
                resp = self.custom.get_namespaced_custom_object(group, version, namespace, plural, name,
                                                                _preload_content=False)
        except NotFoundError:
            return None
        body: dict[str, Any] = json.loads(resp.data)
        return body

    def list_pods(self, node: str) -> tuple[list[dict[str, Any]], str]:
        with translated(f"listing pods on {node}"):
            resp = self.core.list_pod_for_all_namespaces(_preload_content=False, **pod_selectors(node))
        body = json.loads(resp.data)
        return body.get("items") or [], body["metadata"].get("resourceVersion", "")

    def list_unbound_fractions(self) -> list[dict[str, Any]]:
        """The fractional pods no node has yet (spec.nodeName empty), in every namespace, as the API server's watch
        cache has them (resourceVersion 0: no read of etcd)."""
        with translated("listing the fractional pods no node has"):
            resp = self.core.list_pod_for_all_namespaces(
                label_selector=f"{FRACTIONAL_LABEL}={FRACTIONAL_VALUE}", field_selector="spec.nodeName=",
                resource_version="0", _preload_content=False)
        items: list[dict[str, Any]] = json.loads(resp.data).get("items") or []
        return items

    def labelled_nodes(self, label: str) -> list[dict[str, str]]:
        """The labels of every node that carries `label` (any value), from the API server's watch cache."""
        with translated(f"listing the nodes labelled {label}"):
            resp = self.core.list_node(label_selector=label, resource_version="0", _preload_content=False)
        return [(node.get("metadata") or {}).get("labels") or {} for node in json.loads(resp.data).get("items") or []]

    def watch_pods(self, node: str, resource_version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]:
        """Raw watch events; raises GoneError on 410 (as a status or an ERROR event)."""
        with translated(f"watching pods on {node}"):
            resp = self.core.list_pod_for_all_namespaces(
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout_seconds,
                _preload_content=False,
                _request_timeout=(10, timeout_seconds + 30),
                **pod_selectors(node),
            )
        try:
            for line in iter_resp_lines(resp):
                if not line or not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    if status.get("code") == GoneError.STATUS:
                        raise GoneError(status.get("message", "resourceVersion too old"))
                    raise ApiError(f"pod watch error: {status.get('message', status)}", status.get("code"))
                yield event
        finally:
            resp.close()
            resp.release_conn()
