"""Holding the guarantee against a real kube-apiserver: `gpufrac agent` as its own process on a node of its own,
with the GPU fakes; pods created by alice through the webhook and bound by the binder; evictions through the real
Eviction API, which honours real PodDisruptionBudgets. Container totals are held on real processes of this machine
standing in for the containers' processes."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from e2e.agent_world import GPU_UUIDS, AgentWorld, FractionalPod, metric_value
from e2e.testing import unique
from e2e.toolkit.wait import wait_until

pytestmark = pytest.mark.e2e

MIB = 1 << 20
H200 = 143771
USABLE_LABEL = "gpufrac.io/gpu-memory-usable-mib.NVIDIA-H200"


def node_world(cluster, tmp_path_factory, name: str, *agent_args: str) -> Iterator[AgentWorld]:
    def admin(*args: str, **kw: str):
        return cluster.kubectl(*args, user="admin", **kw)

    node = unique(name)
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}}
    assert admin("create", "-f", "-", input=json.dumps(body)).rc == 0
    world = AgentWorld(cluster, tmp_path_factory.mktemp(name), node=node)
    world.gpus.reserve(GPU_UUIDS[0], 612)
    world.gpus.reserve(GPU_UUIDS[1], 600)
    world.start_agent(*agent_args)
    try:
        yield world
    finally:
        try:
            world.stop_agent()
        finally:
            world.delete_pods(*world.created)
            admin("delete", "node", node, "--wait=false")


@pytest.fixture(scope="module")
def evicting(cluster, tmp_path_factory):
    yield from node_world(cluster, tmp_path_factory, "guarantee-evict", "--over-limit-action", "kill-newest",
                          "--reclaim-policy", "evict", "--reclaim-grace-period", "1",
                          "--reclaim-victim-grace-period", "7")


@pytest.fixture(scope="module")
def reporting(cluster, tmp_path_factory):
    yield from node_world(cluster, tmp_path_factory, "guarantee-off", "--reclaim-grace-period", "1")


@pytest.fixture(autouse=True)
def _pods_in_the_tests_namespace(request, ns):
    """The modules' nodes and agents serve every test; the pods each test makes are in its own namespace."""
    for world in ("evicting", "reporting"):
        if world in request.fixturenames:
            request.getfixturevalue(world).namespace = ns


def events(world: AgentWorld, pod: str, reason: str) -> list[dict]:
    return [e for e in world.events_for(pod) if e["reason"] == reason]


def deleting(world: AgentWorld, name: str) -> bool:
    """Evicted: the API server marked it for deletion (no kubelet here finishes it) or it is gone."""
    rc, out, _ = world.cp.kubectl("get", "pod", "-n", world.namespace_of(name), name, "-o", "json", user="admin")
    return rc != 0 or "deletionTimestamp" in json.loads(out)["metadata"]


def test_usable_memory_label_and_metric_from_the_fake_reserve(evicting):
    def labelled() -> dict[str, str] | None:
        labels = evicting.get_node()["metadata"].get("labels", {})
        return labels if USABLE_LABEL in labels else None

    labels = wait_until(labelled, 60, "the usable-memory label")
    assert labels[USABLE_LABEL] == str(H200 - 612)  # the least of the node's two H200s
    text = evicting.metrics()
    for uuid, reserved in zip(GPU_UUIDS, (612, 600), strict=True):
        assert metric_value(text, "gpufrac_gpu_memory_usable_bytes", UUID=uuid) == (H200 - reserved) * MIB
        assert metric_value(text, "gpufrac_gpu_memory_reserved_bytes", UUID=uuid) == reserved * MIB


def test_two_processes_together_over_the_limit_the_newest_is_killed(evicting):
    fp = evicting.create_pod(unique("totals"), gpu_uuid=GPU_UUIDS[0], limit_mib=8000)
    older = evicting.start_live_process(fp, 5000)
    wait_until(lambda: metric_value(evicting.metrics(), "gpufrac_container_gpu_memory_used_bytes",
                                    pod=fp.name) == 5000 * MIB, 60, "the first process in metrics")
    newer = evicting.start_live_process(fp, 4000)  # each under the 8000 MiB pinned limit, together over it
    try:
        [exceeded] = wait_until(lambda: events(evicting, fp.name, "GPUMemoryLimitExceeded"), 60, "the event")
        assert "uses 9000 MiB" in exceeded["message"] and "over its limit of 8000 MiB" in exceeded["message"]
        assert f"{older.pid} (5000 MiB)" in exceeded["message"] and f"{newer.pid} (4000 MiB)" in exceeded["message"]
        wait_until(lambda: newer.poll() is not None, 60, "the newest process killed")
        assert newer.returncode == -9 and older.poll() is None  # the other keeps running
        [killed] = wait_until(lambda: events(evicting, fp.name, "GPUProcessKilled"), 60, "the kill's event")
        assert f"killed GPU process {newer.pid}, the newest" in killed["message"]
        wait_until(lambda: metric_value(evicting.metrics(), "gpufrac_containers_over_limit") == 0, 60,
                   "the total within the limit again")
        assert older.poll() is None and metric_value(
            evicting.metrics(), "gpufrac_over_limit_actions_total", action="kill-newest", outcome="killed") == 1
    finally:
        for child in (older, newer):
            child.kill()
            child.wait()


def contend(world: AgentWorld, *, b_labels: dict[str, str] | None = None) -> tuple[FractionalPod, FractionalPod,
                                                                                   list[int]]:
    """On GPU 1: A at the start of its 60000 MiB request (20000 used), B grown from its 10000 MiB request to 110000
    MiB, until A's request no longer fits (13171 MiB free, 40000 owed). Returns the pods and their processes."""
    a = world.create_pod(unique("reclaim-a"), gpu_uuid=GPU_UUIDS[1], limit_mib=60000)
    b = world.create_pod(unique("reclaim-b"), gpu_uuid=GPU_UUIDS[1], limit_mib=120000, request_mib=10000,
                         labels=b_labels)
    a_pid = world.start_process(a, used_mib=20000, sm_util=10)
    b_pid = world.start_process(b, used_mib=10000, sm_util=10)
    wait_until(lambda: metric_value(world.metrics(), "gpufrac_container_gpu_memory_used_bytes",
                                    pod=b.name) == 10000 * MIB, 60, "both pods in metrics")
    assert metric_value(world.metrics(), "gpufrac_gpu_memory_guarantee_shortfall_bytes", UUID=GPU_UUIDS[1]) == 0
    world.set_process_memory(b_pid, 110000)
    return a, b, [a_pid, b_pid]


def leave(world: AgentWorld, pods: list[FractionalPod], pids: list[int]) -> None:
    """The kubelet's part once pods go: their processes leave the GPU."""
    for pid in pids:
        world.remove_process(pid)
    world.delete_pods(*(p.name for p in pods))


def test_evict_reclaims_from_the_pod_above_its_request(evicting, ns):
    a, b, pids = contend(evicting)
    [on_b] = wait_until(lambda: events(evicting, b.name, "GPUMemoryReclaimed"), 60, "the Event on B")
    assert f"for {ns}/{a.name} (container app: 40000 MiB of its 60000 MiB request not yet used)" in on_b["message"]
    assert "it uses 110000 MiB there, 100000 MiB above its requests" in on_b["message"]
    [on_a] = wait_until(lambda: events(evicting, a.name, "GPUMemoryReclaimedFor"), 60, "the Event on A")
    assert on_a["type"] == "Normal" and f"evicted {ns}/{b.name} (110000 MiB on" in on_a["message"]
    assert deleting(evicting, b.name)  # through the Eviction API
    assert not deleting(evicting, a.name)
    # the API server took the eviction's grace period (reclaim.victimGracePeriodSeconds), not the pod's own, and its
    # UID precondition (a wrong one would have been a 409)
    _, out, _ = evicting.cp.kubectl("get", "pod", "-n", evicting.namespace_of(b.name), b.name, "-o", "json",
                                    user="admin")
    assert json.loads(out)["metadata"]["deletionGracePeriodSeconds"] == 7
    text = evicting.metrics()
    assert metric_value(text, "gpufrac_reclaims_total", outcome="evicted") == 1
    assert metric_value(text, "gpufrac_reclaimed_bytes_total") == 110000 * MIB
    evicting.remove_process(pids[1])  # B's container is gone: A's request fits
    wait_until(lambda: metric_value(evicting.metrics(), "gpufrac_gpu_memory_guarantee_shortfall_bytes",
                                    UUID=GPU_UUIDS[1]) == 0, 60, "no shortfall")
    assert metric_value(evicting.metrics(), "gpufrac_reclaims_total", outcome="evicted") == 1  # evicted once
    leave(evicting, [a, b], pids)


def test_a_blocking_disruption_budget_is_honoured_then_retried(evicting, admin, ns):
    group = unique("guarded")
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": group,
           "namespace": ns}, "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"group": group}}}}
    assert admin("create", "-f", "-", input=json.dumps(pdb)).rc == 0
    try:
        a, b, pids = contend(evicting, b_labels={"group": group})
        [blocked] = wait_until(lambda: events(evicting, b.name, "GPUReclaimBlocked"), 60, "the refusal's Event")
        assert "disruption budget" in blocked["message"] and "next candidate is tried" in blocked["message"]
        [short] = wait_until(lambda: events(evicting, a.name, "GPUMemoryGuaranteeShort"), 60, "the Event on A")
        assert f"evictions refused for {ns}/{b.name}" in short["message"]
        assert not deleting(evicting, b.name)
        wait_until(lambda: metric_value(evicting.metrics(), "gpufrac_reclaims_total", outcome="blocked") >= 2, 60,
                   "retried after the grace period")
        assert not deleting(evicting, b.name)
        # what the disruption controller would write once B may go: the retry evicts it
        status = {"status": {"observedGeneration": 1, "disruptionsAllowed": 1, "currentHealthy": 1,
                             "desiredHealthy": 0, "expectedPods": 1}}
        assert admin("patch", "pdb", group, "--subresource=status", "--type=merge",
                     "-p", json.dumps(status)).rc == 0
        wait_until(lambda: deleting(evicting, b.name), 60, "B evicted once its budget allows")
        assert wait_until(lambda: events(evicting, b.name, "GPUMemoryReclaimed"), 60, "the Event on B")
        leave(evicting, [a, b], pids)
    finally:
        admin("delete", "pdb", group, "--wait=false")


def test_off_only_reports_what_would_be_reclaimed(reporting):
    a, b, pids = contend(reporting)
    [event] = wait_until(lambda: events(reporting, b.name, "GPUReclaimWouldEvict"), 60, "the Event")
    assert "reclaim.policy is off: would evict this pod" in event["message"] and a.name in event["message"]
    text = reporting.metrics()
    assert metric_value(text, "gpufrac_reclaims_total", outcome="would-evict") == 1
    assert metric_value(text, "gpufrac_gpu_memory_guarantee_shortfall_bytes", UUID=GPU_UUIDS[1]) == (
        40000 - (H200 - 600 - 130000)) * MIB
    assert not deleting(reporting, b.name)
    assert events(reporting, a.name, "GPUMemoryReclaimedFor") == []
    leave(reporting, [a, b], pids)
