"""Issue 31's back-off on the real node: a Deployment's fractional pod carries the node affinity the webhook adds for
its ReplicaSet, and while the node has that ReplicaSet's back-off label (what the agent puts on before a reclaim
eviction, tests/agent/test_guarantee.py) kube-scheduler does not place the replacement of a pod that went on it;
without the label it does. The pods use the default scheduler: KAI's is not in the harness (docs/operations.md says
why KAI honours it the same way).

Runs against the session's real node and release (tests/node/conftest.py) and leaves both as it found them.
"""

from __future__ import annotations

import json
import time

import pytest

from e2e.install import Helm
from e2e.names import NODE_NAME, USER_NAMESPACE
from e2e.node import RealCluster
from e2e.pods import get_json
from e2e.testing import example, unique
from e2e.toolkit.wait import wait_until
from gpufrac.core.contract import reclaim_backoff_label

pytestmark = [pytest.mark.e2e, pytest.mark.real_node]

NV = "nvidia.com/container.app."


def deployment(name: str) -> dict:
    """One replica of a time-slicing fraction, placed by the default scheduler (unbound by KAI's binder, so its
    container is refused at creation: only where it is placed matters here)."""
    pod = example("notebook-time-slicing.yaml", name)
    pod["metadata"]["annotations"] = {NV + "gpu-memory.request": "1Gi", NV + "gpu-compute.mode": "time-slicing"}
    pod["metadata"]["labels"] = {"app": name}
    pod["spec"].pop("schedulerName", None)
    pod["spec"]["terminationGracePeriodSeconds"] = 0
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": USER_NAMESPACE},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": pod["metadata"]["labels"],
                                               "annotations": pod["metadata"]["annotations"]},
                                  "spec": pod["spec"]}}}


def pods_of(node: RealCluster, app: str) -> list[dict]:
    found = get_json(node, "get", "pods", "-n", USER_NAMESPACE, "-l", f"app={app}")["items"]
    return [p for p in found if not p["metadata"].get("deletionTimestamp")]


def label_node(node: RealCluster, label: str, value: str | None) -> None:
    res = node.kubectl("label", "node", NODE_NAME, "--overwrite",
                       f"{label}={value}" if value is not None else f"{label}-", user="admin")
    assert res.rc == 0, res.stderr


def test_a_replacement_is_not_placed_on_a_node_holding_its_controllers_back_off(node: RealCluster,
                                                                                evicting: Helm) -> None:
    """With reclaim evicting (the webhook adds the back-off affinity only then: --keep-off-reclaimed-nodes)."""
    name = unique("backoff")
    manifest = deployment(name)
    label = None
    try:
        res = node.kubectl("create", "-f", "-", input=json.dumps(manifest), user="alice")
        assert res.rc == 0, res.stderr
        first = wait_until(lambda: next((p for p in pods_of(node, name) if p["spec"].get("nodeName")), None), 120,
                           "the first pod placed by kube-scheduler")
        [owner] = [r for r in first["metadata"]["ownerReferences"] if r.get("controller")]
        label = reclaim_backoff_label(owner["uid"])
        terms = first["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        assert all({"key": label, "operator": "DoesNotExist"} in t["matchExpressions"] for t in terms), terms
        label_node(node, label, str(int(time.time()) + 600))  # the agent's back-off, before it evicts
        res = node.kubectl("delete", "pod", "-n", USER_NAMESPACE, first["metadata"]["name"], "--grace-period=0",
                           "--force", user="admin")
        assert res.rc == 0, res.stderr

        def unschedulable() -> dict | None:
            found = [p for p in pods_of(node, name) if p["metadata"]["uid"] != first["metadata"]["uid"]]
            conditions = {c["type"]: c for c in (found[0]["status"].get("conditions") or [])} if found else {}
            scheduled = conditions.get("PodScheduled", {})
            return found[0] if scheduled.get("reason") == "Unschedulable" else None

        replacement = wait_until(unschedulable, 120, "the replacement refused by kube-scheduler")
        message = {c["type"]: c for c in replacement["status"]["conditions"]}["PodScheduled"]["message"]
        print(message)
        assert "node affinity" in message, message
        time.sleep(3)
        assert not get_json(node, "get", "pod", "-n", USER_NAMESPACE, replacement["metadata"]["name"])["spec"].get(
            "nodeName"), "placed on the node during its controller's back-off"

        label_node(node, label, None)  # the back-off over: the agent takes the label off
        wait_until(lambda: get_json(node, "get", "pod", "-n", USER_NAMESPACE, replacement["metadata"]["name"])[
            "spec"].get("nodeName") == NODE_NAME, 120, "the replacement placed once the back-off ended")
    finally:
        node.kubectl("delete", "deployment", "-n", USER_NAMESPACE, name, "--ignore-not-found", "--wait=false",
                     user="admin")
        node.kubectl("delete", "pods", "-n", USER_NAMESPACE, "-l", f"app={name}", "--grace-period=0", "--force",
                     "--ignore-not-found", user="admin")
        if label is not None:
            node.kubectl("label", "node", NODE_NAME, f"{label}-", user="admin")
