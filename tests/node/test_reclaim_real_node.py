"""Reclaim above request on the real node (issue 22): the agent's evictions go through the Eviction API against a
PodDisruptionBudget whose status kube-controller-manager's disruption controller keeps, and the kubelet really
stops the evicted pod. The GPU is the fake NVML, listing the containers' real host processes.

Runs against the session's real node and release (tests/node/conftest.py) and leaves both as it found them: the
release rolled back to its revision, the fake NVML's state written back, its pods and budget gone.
"""

from __future__ import annotations

import json
import os

import pytest

from e2e.agent_world import metric_value
from e2e.install import Helm
from e2e.names import USER_NAMESPACE
from e2e.node import GPU_UUIDS, RealCluster
from e2e.pods import agent_metrics, bind, create, events, get_json, host_pids, wait_running
from e2e.testing import example, unique
from e2e.toolkit.wait import wait_until

# Two helm upgrades (agent rollouts), two pods, the agent's grace periods and the kubelet's stop, under load.
pytestmark = [pytest.mark.e2e, pytest.mark.real_node, pytest.mark.timeout(900)]

NV = "nvidia.com/container.app."
GPU = GPU_UUIDS[0]


def fraction(name: str, request_mib: int, limit_mib: int, labels: dict[str, str] | None = None) -> dict:
    """A time-slicing fraction with absolute memory values, as a user writes it."""
    pod = example("notebook-time-slicing.yaml", name)
    pod["metadata"]["annotations"] = {NV + "gpu-memory.request": f"{request_mib}Mi",
                                      NV + "gpu-memory.limit": f"{limit_mib}Mi",
                                      NV + "gpu-compute.mode": "time-slicing"}
    pod["metadata"]["labels"] = {**pod["metadata"].get("labels", {}), **(labels or {})}
    pod["spec"]["terminationGracePeriodSeconds"] = 1
    return pod


def reasons(node: RealCluster, name: str, reason: str) -> list[dict]:
    """The agent's Events of one reason on a pod."""
    return [e for e in events(node, name) if e["reason"] == reason
            and e.get("source", {}).get("component") == "gpufrac-agent"]


def gone(node: RealCluster, name: str) -> bool:
    return node.kubectl("get", "pod", name, "-n", USER_NAMESPACE, user="admin").rc != 0


def shortfall(node: RealCluster) -> float | None:
    try:
        return metric_value(agent_metrics(node), "gpufrac_gpu_memory_guarantee_shortfall_bytes", UUID=GPU)
    except OSError:
        return None  # the agent between two pods


def budget(node: RealCluster, name: str, allowed: int) -> bool:
    """The disruption controller has observed the budget, counts B, and allows that many disruptions."""
    pdb = get_json(node, "get", "pdb", "-n", USER_NAMESPACE, name)
    status = pdb.get("status", {})
    return (status.get("observedGeneration") == pdb["metadata"]["generation"] and status.get("expectedPods") == 1
            and status.get("disruptionsAllowed") == allowed)


def test_a_blocking_budget_then_the_eviction(node: RealCluster, evicting: Helm, gpu_processes):
    group = unique("guarded")
    a_name, b_name = unique("reclaim-a"), unique("reclaim-b")
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
           "metadata": {"name": group, "namespace": USER_NAMESPACE},
           "spec": {"minAvailable": 1, "selector": {"matchLabels": {"group": group}}}}
    try:
        res = node.kubectl("create", "-f", "-", input=json.dumps(pdb), user="admin")
        assert res.rc == 0, res.stderr
        for name, request, limit, labels in ((a_name, 60000, 60000, None), (b_name, 10000, 120000, {"group": group})):
            res = create(node, fraction(name, request, limit, labels))
            assert res.rc == 0, res.stderr
            bind(node, name, {NV + "gpus.devices": GPU})
        a_pid, b_pid = (host_pids(node, wait_running(node, n, timeout=240)["metadata"]["name"])[0]
                        for n in (a_name, b_name))
        # the disruption controller has seen B: its budget allows no disruption (a count, not maxUnavailable: B has
        # no controller whose scale the disruption controller could read)
        wait_until(lambda: budget(node, group, allowed=0), 120, "the budget's status")
        # A at the start of its request, B grown far above its own: A's 40000 MiB owed do not fit in 13771 free
        gpu_processes.processes(GPU, [{"pid": a_pid, "used_memory_mib": 20000, "sm_util": 10},
                                      {"pid": b_pid, "used_memory_mib": 110000, "sm_util": 50}])
        blocked = wait_until(lambda: reasons(node, b_name, "GPUReclaimBlocked"), 180, "the refusal on B")[0]
        print(blocked["message"])
        assert blocked["type"] == "Warning"
        assert "disruption budget" in blocked["message"], blocked["message"]
        assert f"{USER_NAMESPACE}/{a_name} (container app: 40000 MiB of its 60000 MiB" in blocked["message"]
        short = wait_until(lambda: reasons(node, a_name, "GPUMemoryGuaranteeShort"), 120, "the Event on A")[0]
        print(short["message"])
        assert f"evictions refused for {USER_NAMESPACE}/{b_name}" in short["message"], short["message"]
        assert not gone(node, b_name), "evicted around its budget"
        assert wait_running(node, b_name)

        # one disruption allowed: the agent's next try evicts B, and the kubelet stops it
        patch = json.dumps({"spec": {"minAvailable": 0}})
        res = node.kubectl("patch", "pdb", "-n", USER_NAMESPACE, group, "--type=merge", "-p", patch, user="admin")
        assert res.rc == 0, res.stderr
        wait_until(lambda: budget(node, group, allowed=1), 120, "the budget allowing one disruption")
        reclaimed = wait_until(lambda: reasons(node, b_name, "GPUMemoryReclaimed"), 180, "the eviction's Event")[0]
        print(reclaimed["message"])
        assert reclaimed["type"] == "Warning"
        assert f"{USER_NAMESPACE}/{a_name} (container app: 40000 MiB of its 60000 MiB" in reclaimed["message"]
        assert "it uses 110000 MiB there, 100000 MiB above its requests" in reclaimed["message"]
        told = wait_until(lambda: reasons(node, a_name, "GPUMemoryReclaimedFor"), 120, "the Event on A")[0]
        print(told["message"])
        assert told["type"] == "Normal"
        assert f"evicted {USER_NAMESPACE}/{b_name} (110000 MiB on {GPU}" in told["message"], told["message"]
        wait_until(lambda: gone(node, b_name), 180, "B stopped by the kubelet and gone")
        assert not os.path.exists(f"/proc/{b_pid}"), "B's process outlived its pod"
        # the driver no longer lists B's process: A's request fits, and A kept running
        gpu_processes.processes(GPU, [{"pid": a_pid, "used_memory_mib": 20000, "sm_util": 10}])
        wait_until(lambda: shortfall(node) == 0, 120, "no shortfall left on the GPU")
        assert wait_running(node, a_name)["status"]["containerStatuses"][0]["restartCount"] == 0
    finally:
        node.kubectl("delete", "pdb", "-n", USER_NAMESPACE, group, "--ignore-not-found", user="admin")
        node.kubectl("delete", "pod", "-n", USER_NAMESPACE, a_name, b_name, "--ignore-not-found", "--wait=false",
                     "--grace-period=0", "--force", user="admin")
        wait_until(lambda: gone(node, a_name) and gone(node, b_name), 180, "the test's pods gone")
