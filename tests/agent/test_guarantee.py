"""Container totals, reclaim above request and usable capacity through the agent's loop in one process: real
pynvml over the fake libnvidia-ml.so.1, a fake /proc (with real processes where one is killed), and an in-memory
Kubernetes API."""

from __future__ import annotations

import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from e2e.toolkit.wait import wait_until
from gpufrac.agent.decide.claim_tenants import ClaimTenants
from gpufrac.agent.decide.overlimit import OverLimitAction
from gpufrac.agent.decide.reclaim import ReclaimPolicy, ReclaimSettings
from gpufrac.agent.dra.decide.claims import ClaimPod, ClaimRef
from gpufrac.agent.dra.decide.prepare import PreparedClaim, PreparedDevice
from gpufrac.agent.dra.decide.tenants import claim_tenants
from gpufrac.agent.edges.metrics import AgentMetrics
from gpufrac.agent.edges.nvml import NvmlSource
from gpufrac.agent.node.agent_config import AgentConfig
from gpufrac.agent.node.guarantee import GuaranteeConfig
from gpufrac.agent.node.node_loop import Agent
from gpufrac.core.contract import MIB, reclaim_backoff_label
from gpufrac.kube.errors import KubeError
from testkit.agent import (
    UUID_A,
    UUID_B,
    FakeKube,
    canonical_annotations,
    cid,
    env_for,
    placing,
    pod,
    scrape,
    value,
)
from testkit.fakes.state import ProcRoot
from testkit.pods import running_pod

NODE = "gpu-node-1"


@pytest.fixture
def node(tmp_path: Path, fake_gpus, mps_binary, monkeypatch):
    """GPU A (80000 MiB, GPU 0: also the GPU of the live processes in $GPUFRAC_FAKE_GPU_PROCESSES) and GPU B."""
    fake_gpus.gpu(UUID_A, memory_total_mib=80000).gpu(UUID_B, memory_total_mib=80000)
    live = tmp_path / "live"
    live.mkdir()
    monkeypatch.setenv("GPUFRAC_FAKE_GPU_PROCESSES", str(live))
    proc = ProcRoot(tmp_path / "proc")
    kube = FakeKube()
    config = AgentConfig(node=NODE, mps_binary=mps_binary, mps_root=tmp_path / "mps", mps_log_root=tmp_path / "log",
                         mps_config_dir=tmp_path / "cfg", proc_root=proc.root,
                         memory_limit_file=tmp_path / "memory.max", interval=0.05, quit_timeout=5.0,
                         cgroup_controllers_file=tmp_path / "cgroup.controllers")
    agents: list[Agent] = []
    children: list[subprocess.Popen[bytes]] = []

    class Node:
        def __init__(self) -> None:
            self.gpus, self.kube, self.proc = fake_gpus, kube, proc

        def agent(self, guarantee: GuaranteeConfig, **options: Any) -> Agent:
            agent = Agent(replace(config, guarantee=guarantee), kube, NvmlSource(), AgentMetrics(node=NODE), **options)
            agent.start()
            agent.pods.synced.wait(10)
            agents.append(agent)
            return agent

        def add_pod(self, name: str, n: int, *, request_mib: int, limit_mib: int, gpu: str = UUID_A,
                    priority: int | None = None, started: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
            body = pod(name, uid=f"u-{name}", containers={"app": cid(n)}, annotations=canonical_annotations(
                "app", request_mib=request_mib, limit_mib=limit_mib, devices=[gpu]))
            body["status"]["startTime"] = started
            if priority is not None:
                body["spec"]["priority"] = priority
            kube.pods.append(body)
            return body

        def live_process(self, n: int, pod_uid: str, used_mib: int, limit_mib: int) -> subprocess.Popen[bytes]:
            """A real process of container n on GPU A, as the fake libcuda would report it."""
            child = subprocess.Popen(["sleep", "300"])
            children.append(child)
            proc.add(child.pid, cid(n), env_for("time-slicing", limit_mib, limit_mib, UUID_A), pod_uid=pod_uid,
                     real=True)
            (live / f"{child.pid}.json").write_text(
                f'{{"pid": {child.pid}, "used_memory_mib": {used_mib}, "sm_util": 10}}')
            return child

        def events(self, reason: str) -> list[dict[str, Any]]:
            return [e for e in kube.events.values() if e["reason"] == reason]

    yield Node()
    for agent in agents:
        agent.shutdown()
    for child in children:
        child.kill()
        child.wait()


# ---- container totals ----

def test_two_processes_under_the_limit_together_over_it_name_both_pids_and_the_total(node):
    node.add_pod("train", 1, request_mib=20000, limit_mib=20000)
    first = node.live_process(1, "u-train", 12000, 20000)
    second = node.live_process(1, "u-train", 11000, 20000)
    agent = node.agent(GuaranteeConfig())  # overLimitAction: event
    agent.tick()
    [event] = node.events("GPUMemoryLimitExceeded")
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "train"
    assert "uses 23000 MiB" in event["message"] and "over its limit of 20000 MiB" in event["message"]
    assert f"{first.pid} (12000 MiB)" in event["message"] and f"{second.pid} (11000 MiB)" in event["message"]
    assert "what holds it: its cgroup limit, set through NVML and read back (hard)" in event["message"]  # issue 43
    assert value(agent.metrics, "gpufrac_containers_over_limit") == 1
    agent.tick()
    assert first.poll() is None and second.poll() is None  # event: nothing else happens
    assert node.kube.evictions == [] and node.events("GPUProcessKilled") == []


def test_kill_newest_kills_the_newest_process_and_the_other_keeps_running(node):
    node.add_pod("train", 1, request_mib=20000, limit_mib=20000)
    older = node.live_process(1, "u-train", 12000, 20000)
    time.sleep(0.1)  # a later start time, in clock ticks
    newer = node.live_process(1, "u-train", 11000, 20000)
    agent = node.agent(GuaranteeConfig(OverLimitAction.KILL_NEWEST))
    agent.tick()
    wait_until(lambda: newer.poll() is not None, 10, "the newest process killed")
    assert newer.returncode == -9
    assert older.poll() is None
    [event] = node.events("GPUProcessKilled")
    assert f"killed GPU process {newer.pid}, the newest" in event["message"]
    assert f"keep running ({older.pid})" in event["message"] and "uses 23000 MiB" in event["message"]
    assert value(agent.metrics, "gpufrac_over_limit_actions_total", action="kill-newest", outcome="killed") == 1
    agent.tick()  # NVML no longer lists it: the total fits again
    assert value(agent.metrics, "gpufrac_containers_over_limit") == 0
    assert older.poll() is None and len(node.events("GPUProcessKilled")) == 1


def test_kill_newest_leaves_a_reused_pid_alone(node, monkeypatch):
    node.add_pod("train", 1, request_mib=20000, limit_mib=20000)
    child = node.live_process(1, "u-train", 25000, 20000)
    agent = node.agent(GuaranteeConfig(OverLimitAction.KILL_NEWEST))
    # between the read that chose it and the kill, the PID names a process started later
    starts = iter([100, 200])
    monkeypatch.setattr("gpufrac.agent.node.container_totals.read_start_time", lambda root, pid: next(starts))
    agent.tick()
    assert child.poll() is None and node.events("GPUProcessKilled") == []


def test_evict_evicts_the_pod_once(node):
    node.add_pod("train", 1, request_mib=20000, limit_mib=20000)
    node.live_process(1, "u-train", 12000, 20000)
    node.live_process(1, "u-train", 12000, 20000)
    agent = node.agent(GuaranteeConfig(OverLimitAction.EVICT))
    agent.tick()
    agent.tick()
    assert node.kube.evictions == [("team-a", "train")]
    [event] = node.events("GPUMemoryLimitEvicted")
    assert "uses 24000 MiB" in event["message"]
    assert value(agent.metrics, "gpufrac_over_limit_actions_total", action="evict", outcome="evicted") == 1


# ---- reclaim above request ----

def contended(node) -> None:
    """A at its request's start (10000 of 30000 MiB used), B grown to 55000 MiB over its 10000 MiB request: 15000
    free, 20000 owed to A."""
    node.add_pod("a", 1, request_mib=30000, limit_mib=30000, started="2026-01-01T00:00:00Z")
    node.add_pod("b", 2, request_mib=10000, limit_mib=60000, started="2026-01-01T01:00:00Z")
    node.proc.add(4001, cid(1), env_for("time-slicing", 30000, 30000, UUID_A), pod_uid="u-a")
    node.proc.add(4002, cid(2), env_for("time-slicing", 60000, 10000, UUID_A), pod_uid="u-b")
    node.gpus.processes(UUID_A, [{"pid": 4001, "used_memory_mib": 10000, "sm_util": 5},
                                 {"pid": 4002, "used_memory_mib": 55000, "sm_util": 50}])


def reclaiming(policy: ReclaimPolicy, grace: float = 0.0) -> GuaranteeConfig:
    return GuaranteeConfig(reclaim=ReclaimSettings(policy, grace_seconds=grace, hysteresis_bytes=256 * MIB))


def test_evict_reclaims_from_the_pod_above_its_request_with_events_on_both(node):
    contended(node)
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "b-5d9f", "uid": "u-rs-b", "controller": True}
    node.kube.pods[1]["metadata"]["ownerReferences"] = [owner]
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT))
    agent.tick()
    assert node.kube.evictions == [("team-a", "b")]
    [on_owner] = node.events("GPUMemoryReclaimedFromPod")  # its controller is told, beside the pod
    assert on_owner["involvedObject"] == {"apiVersion": "apps/v1", "kind": "ReplicaSet", "namespace": "team-a",
                                          "name": "b-5d9f", "uid": "u-rs-b"}
    assert on_owner["message"].startswith(f"evicted its pod b on node {NODE} to reclaim GPU memory on {UUID_A} for "
                                          "team-a/a (container app: 20000 MiB of its 30000 MiB request not yet used)")
    assert on_owner["metadata"]["labels"] == {"gpufrac.io/reclaim": "owner"}
    [on_b] = node.events("GPUMemoryReclaimed")
    assert on_b["involvedObject"]["name"] == "b" and on_b["type"] == "Warning"
    assert "evicted this pod to reclaim GPU memory on " + UUID_A in on_b["message"]
    assert "for team-a/a (container app: 20000 MiB of its 30000 MiB request not yet used)" in on_b["message"]
    assert "it uses 55000 MiB there, 45000 MiB above its requests" in on_b["message"]
    [on_a] = node.events("GPUMemoryReclaimedFor")
    assert on_a["involvedObject"]["name"] == "a" and on_a["type"] == "Normal"
    assert "evicted team-a/b (55000 MiB on" in on_a["message"]
    m = agent.metrics
    assert value(m, "gpufrac_reclaims_total", outcome="evicted") == 1
    assert value(m, "gpufrac_reclaimed_bytes_total") == 55000 * MIB
    gpu = {"UUID": UUID_A, "Hostname": NODE, "modelName": "NVIDIA H200"}
    assert value(m, "gpufrac_gpu_memory_guarantee_shortfall_bytes", **gpu) == 5000 * MIB
    node.kube.pods[1]["metadata"]["deletionTimestamp"] = "2026-01-01T02:00:00Z"  # the eviction's effect
    agent.pods.relist()
    agent.tick()
    agent.tick()
    assert node.kube.evictions == [("team-a", "b")]  # going already: not evicted again
    node.gpus.processes(UUID_A, [{"pid": 4001, "used_memory_mib": 10000, "sm_util": 5}])  # B is gone
    node.kube.pods.pop()
    agent.pods.relist()
    agent.tick()
    assert value(m, "gpufrac_gpu_memory_guarantee_shortfall_bytes", **gpu) == 0
    assert node.kube.evictions == [("team-a", "b")]


def test_an_evicted_pods_controller_is_kept_off_the_node_for_the_back_off(node):
    """Reclaim evicts B, a ReplicaSet's pod: the node gets that ReplicaSet's back-off label, its value the back-off's
    end, which the webhook's node affinity for the ReplicaSet's pods fails on; once it ends the label goes. An
    agent started later keeps the back-offs it finds on the node and removes those that ended."""
    contended(node)
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "b-5d9f", "uid": "u-rs-b", "controller": True}
    node.kube.pods[1]["metadata"]["ownerReferences"] = [owner]
    now = [1_800_000_000.0]
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT), wall_clock=lambda: now[0])
    patches = len(node.kube.label_patches)
    agent.tick()
    assert node.kube.evictions == [("team-a", "b")]
    label = reclaim_backoff_label("u-rs-b")
    assert node.kube.labels[label] == "1800000600"  # reclaim.backoffSeconds: 600
    # on the node before the eviction: the ReplicaSet creates the replacement at once
    assert label in node.kube.label_patches[node.kube.evicted_after_patch[0]]
    assert len(node.kube.label_patches) > patches
    [on_owner] = node.events("GPUMemoryReclaimedFromPod")
    assert f"its fractional pods are kept off node {NODE} until 2027-01-15T08:10:00Z" in on_owner["message"]
    node.gpus.processes(UUID_A, [{"pid": 4001, "used_memory_mib": 10000}])  # B is gone
    node.kube.pods.pop()
    agent.pods.relist()
    now[0] += 599
    agent.tick()
    assert label in node.kube.labels
    now[0] += 2
    agent.tick()
    assert label not in node.kube.labels
    ended, running = reclaim_backoff_label("u-old"), reclaim_backoff_label("u-new")
    node.kube.labels.update({ended: str(int(now[0]) - 1), running: str(int(now[0]) + 60), "zone": "a"})
    later = node.agent(reclaiming(ReclaimPolicy.EVICT), wall_clock=lambda: now[0])
    later.tick()
    assert running in node.kube.labels and ended not in node.kube.labels and node.kube.labels["zone"] == "a"


def test_off_only_says_what_would_have_been_reclaimed(node):
    contended(node)
    agent = node.agent(reclaiming(ReclaimPolicy.OFF))
    agent.tick()
    agent.tick()
    assert node.kube.evictions == []
    [event] = node.events("GPUReclaimWouldEvict")
    assert event["involvedObject"]["name"] == "b"
    assert "reclaim.policy is off: would evict this pod" in event["message"] and "team-a/a" in event["message"]
    assert value(agent.metrics, "gpufrac_reclaims_total", outcome="would-evict") == 1  # once per episode
    assert value(agent.metrics, "gpufrac_reclaims_total", outcome="evicted") == 0


def test_a_blocking_disruption_budget_is_honoured_and_retried(node):
    contended(node)
    node.kube.pods[1]["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "b", "uid": "u-sts-b", "controller": True}]
    node.kube.blocked.add("b")
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT))
    agent.tick()
    assert node.kube.evictions == []
    backoff = reclaim_backoff_label("u-sts-b")
    assert backoff not in node.kube.labels  # put on before the eviction, taken off when it was refused
    assert any(backoff in patch for patch in node.kube.label_patches)
    [blocked] = node.events("GPUReclaimBlocked")
    assert blocked["involvedObject"]["name"] == "b"
    assert "would violate the pod's disruption budget" in blocked["message"]
    [short] = node.events("GPUMemoryGuaranteeShort")
    assert short["involvedObject"]["name"] == "a" and "evictions refused for team-a/b" in short["message"]
    assert value(agent.metrics, "gpufrac_reclaims_total", outcome="blocked") == 1
    node.kube.blocked.clear()  # the budget allows a disruption again
    agent.tick()
    assert node.kube.evictions == [("team-a", "b")] and backoff in node.kube.labels


def test_a_higher_priority_pod_is_reclaimed_after_a_lower_one(node):
    contended(node)
    node.kube.pods[1]["spec"]["priority"] = 1000
    node.add_pod("c", 3, request_mib=1000, limit_mib=20000, started="2025-01-01T00:00:00Z")  # older, priority 0
    node.proc.add(4003, cid(3), env_for("time-slicing", 20000, 1000, UUID_A), pod_uid="u-c")
    node.gpus.processes(UUID_A, [{"pid": 4001, "used_memory_mib": 10000}, {"pid": 4002, "used_memory_mib": 45000},
                                 {"pid": 4003, "used_memory_mib": 10000}])
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT))
    agent.tick()
    assert node.kube.evictions == [("team-a", "c")]  # c's 10000 MiB cover the 5000 short: b stays


def test_a_gang_at_its_minimum_keeps_its_members_and_one_with_a_member_to_spare_loses_one(node):
    """B and C burst above their requests and are two workers of one KAI gang (PodGroup `train`, minMember 2). At
    its minimum, or with its PodGroup unreadable, neither is evicted and the shortage is said; with three running
    (a third worker elsewhere), one of them is."""
    contended(node)
    node.add_pod("c", 3, request_mib=1000, limit_mib=20000, started="2026-01-01T02:00:00Z")
    node.proc.add(4003, cid(3), env_for("time-slicing", 20000, 1000, UUID_A), pod_uid="u-c")
    node.gpus.processes(UUID_A, [{"pid": 4001, "used_memory_mib": 10000}, {"pid": 4002, "used_memory_mib": 45000},
                                 {"pid": 4003, "used_memory_mib": 10000}])
    for body in node.kube.pods[1:]:
        body["metadata"]["annotations"]["pod-group-name"] = "train"
    gang = {"spec": {"minMember": 2}, "status": {"running": 2}}
    node.kube.pod_groups[("team-a", "train")] = gang
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT))
    agent.tick()
    assert node.kube.evictions == []
    [short] = node.events("GPUMemoryGuaranteeShort")
    assert "needed by its gang at its minimum" in short["message"]
    node.kube.pod_groups[("team-a", "train")] = KubeError("podgroups.scheduling.run.ai is forbidden")
    agent.tick()
    assert node.kube.evictions == []
    node.kube.pod_groups[("team-a", "train")] = {**gang, "status": {"running": 3}}
    agent.tick()
    assert node.kube.evictions == [("team-a", "c")]  # the youngest: its 10000 MiB cover the 5000 MiB short


def test_a_gangs_members_are_victims_like_any_pod_where_configured(node):
    contended(node)
    node.kube.pods[1]["metadata"]["annotations"]["pod-group-name"] = "train"
    node.kube.pod_groups[("team-a", "train")] = {"spec": {"minMember": 2}, "status": {"running": 2}}
    guarantee = reclaiming(ReclaimPolicy.EVICT)
    agent = node.agent(replace(guarantee, reclaim=replace(guarantee.reclaim, evict_gang_members=True)))
    agent.tick()
    assert node.kube.evictions == [("team-a", "b")]


def test_where_the_driver_holds_requests_as_soft_limits_the_agent_evicts_nothing_and_says_so(node, tmp_path):
    """r615 with CUDA 13.4 and the cgroup v2 dmem controller: the driver takes back memory above a request, so the
    agent's eviction would race it. The shortfall is still measured; the condition says who holds the requests."""
    contended(node)
    controllers = tmp_path / "cgroup.controllers"
    controllers.write_text("cpuset cpu io memory hugetlb pids rdma misc dmem\n")
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT))
    agent.tick()
    assert node.kube.evictions == [] and node.events("GPUMemoryGuaranteeShort") == []
    shortfall = {dict(labels)["UUID"]: v for (name, labels), v in scrape(agent.metrics).items()
                 if name == "gpufrac_gpu_memory_guarantee_shortfall_bytes"}
    assert shortfall[UUID_A] == 5000 * MIB
    assert "taken back by the driver" in node.kube.last_condition()["message"]
    controllers.write_text("cpuset cpu io memory hugetlb pids rdma misc\n")  # no dmem: the agent's eviction
    agent.tick()
    assert node.kube.evictions == [("team-a", "b")]
    assert "taken back by the agent's eviction (reclaim.policy evict)" in node.kube.last_condition()["message"]


# ---- usable capacity ----

def test_usable_memory_label_and_metric_from_the_fake_reserve(node):
    node.gpus.reserve(UUID_A, 612)
    node.gpus.reserve(UUID_B, 600)
    agent = node.agent(GuaranteeConfig())
    agent.tick()
    agent.tick()  # labels are published from the previous pass's measure
    label = "gpufrac.io/gpu-memory-usable-mib.NVIDIA-H200"
    assert node.kube.labels[label] == str(80000 - 612)  # the least of the model's GPUs
    m = agent.metrics
    a = {"UUID": UUID_A, "Hostname": NODE, "modelName": "NVIDIA H200"}
    assert value(m, "gpufrac_gpu_memory_usable_bytes", **a) == (80000 - 612) * MIB
    assert value(m, "gpufrac_gpu_memory_reserved_bytes", **a) == 612 * MIB
    assert value(m, "gpufrac_gpu_memory_usable_bytes", UUID=UUID_B, Hostname=NODE, modelName="NVIDIA H200") == (
        80000 - 600) * MIB
    # a tenant's process calling itself an MPS server changes nothing: it is not a child of the agent's daemon
    node.proc.add(666, cid(9), env_for("time-slicing", 1000, 1000, UUID_B), pod_uid="u-x")
    (node.proc.root / "666" / "cmdline").write_bytes(b"/usr/bin/nvidia-cuda-mps-server\0")
    write_stat(node.proc, 666, parent=1)
    node.gpus.processes(UUID_B, [{"pid": 666, "used_memory_mib": 300}])
    agent.tick()
    agent.tick()
    assert value(m, "gpufrac_gpu_memory_usable_bytes", UUID=UUID_B, Hostname=NODE, modelName="NVIDIA H200") == (
        80000 - 600) * MIB
    assert node.kube.labels[label] == str(80000 - 612)
    # an MPS server's context on GPU B is memory no fraction gets either; it is remembered when the server exits
    daemons = [s.pid for s in agent.daemons.statuses().values() if s.pid]
    assert daemons, "the agent runs its MPS control daemons"
    node.proc.add_program(777, ["/opt/renamed-by-nobody"])  # known by its parent, not by its name
    write_stat(node.proc, 777, parent=daemons[0])
    node.gpus.processes(UUID_B, [{"pid": 777, "used_memory_mib": 300}])
    agent.tick()
    agent.tick()
    assert value(m, "gpufrac_gpu_memory_usable_bytes", UUID=UUID_B, Hostname=NODE, modelName="NVIDIA H200") == (
        80000 - 600 - 300) * MIB
    assert node.kube.labels[label] == str(80000 - 900)
    node.gpus.processes(UUID_B, [])
    agent.tick()
    agent.tick()
    assert node.kube.labels[label] == str(80000 - 900)


def write_stat(proc: ProcRoot, pid: int, *, parent: int) -> None:
    """/proc/<pid>/stat as the kernel writes it: the parent is field 4, the start time field 22."""
    (proc.root / str(pid) / "stat").write_text(f"{pid} (some name) S {parent} " + " ".join(["0"] * 17) + " 4242 0\n")


def test_memory_info_through_pynvml(node):
    import pynvml

    node.gpus.reserve(UUID_A, 512)
    node.gpus.processes(UUID_A, [{"pid": 1, "used_memory_mib": 1000}])
    source = NvmlSource()
    memory = source.memory()[UUID_A]
    assert (memory.total_bytes, memory.reserved_bytes, memory.used_bytes, memory.free_bytes) == (
        80000 * MIB, 512 * MIB, 1000 * MIB, (80000 - 512 - 1000) * MIB)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)  # as NVML documents v1: used is reserved + allocated
    assert (v1.used, v1.free) == (1512 * MIB, (80000 - 1512) * MIB)
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(handle, version=0x01000028)
    source.close()


# ---- the guarantee from bind on; one decision on fresh readings ----

def crash_looping(body: dict[str, Any]) -> None:
    """The pod's container after an OOM at start: waiting to be restarted, no process on the GPU."""
    [status] = body["status"]["containerStatuses"]
    status.update(ready=False, restartCount=3, state={"waiting": {"reason": "CrashLoopBackOff"}},
                  lastState={"terminated": {"exitCode": 1, "reason": "Error"}})


@pytest.mark.parametrize("state", ["creating", "crash-looping"])
def test_a_pod_owed_from_bind_gets_its_neighbour_evicted_before_its_first_oom(node, state):
    # a vLLM-style pod allocates its whole 30000 MiB request at start; b has grown to 60000 MiB over its 10000
    a = node.add_pod("a", 1, request_mib=30000, limit_mib=30000)
    if state == "creating":
        a["status"] = {"phase": "Pending", "containerStatuses": [
            {"name": "app", "ready": False, "state": {"waiting": {"reason": "ContainerCreating"}}}]}
    else:
        crash_looping(a)
    node.add_pod("b", 2, request_mib=10000, limit_mib=60000, started="2026-01-01T01:00:00Z")
    node.proc.add(4002, cid(2), env_for("time-slicing", 60000, 10000, UUID_A), pod_uid="u-b")
    node.gpus.processes(UUID_A, [{"pid": 4002, "used_memory_mib": 60000}])  # 20000 MiB free, 30000 owed to a
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT))
    agent.tick()
    assert node.kube.evictions == [("team-a", "b")]  # before a has allocated anything
    [on_a] = node.events("GPUMemoryReclaimedFor")
    assert on_a["involvedObject"]["name"] == "a"
    assert "30000 MiB of its 30000 MiB request not yet used, 20000 MiB free" in on_a["message"]
    node.gpus.processes(UUID_A, [])  # b is gone: a's allocation at start fits
    assert NvmlSource().memory()[UUID_A].free_bytes >= 30000 * MIB


def test_a_pod_still_owed_memory_is_never_a_victim(node):
    # b's first container is above its request, its second is owed: evicting b would not keep b's guarantee
    node.add_pod("a", 1, request_mib=30000, limit_mib=30000)
    crash_looping(node.kube.pods[0])
    b = pod("b", uid="u-b", containers={"big": cid(2), "late": cid(3)}, annotations={
        **canonical_annotations("big", request_mib=10000, limit_mib=60000, devices=[UUID_A])})
    from gpufrac.core.contract import write_canonical
    from testkit.agent import fraction
    b["metadata"]["annotations"] = write_canonical([
        fraction("big", request_mib=10000, limit_mib=60000, devices=[UUID_A]),
        fraction("late", request_mib=5000, limit_mib=5000, devices=[UUID_A])])
    b["status"]["containerStatuses"][1]["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
    node.kube.pods.append(b)
    node.proc.add(4002, cid(2), env_for("time-slicing", 60000, 10000, UUID_A), pod_uid="u-b")
    node.gpus.processes(UUID_A, [{"pid": 4002, "used_memory_mib": 60000}])
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT))
    agent.tick()
    assert node.kube.evictions == []
    assert value(agent.metrics, "gpufrac_reclaims_total", outcome="no-candidate") == 1
    shorts = {e["involvedObject"]["name"] for e in node.events("GPUMemoryGuaranteeShort")}
    assert shorts == {"a", "b"}  # both are owed, and told why nothing could be reclaimed
    assert all("nothing can be reclaimed" in e["message"] for e in node.events("GPUMemoryGuaranteeShort"))


def three_above(node) -> None:
    """a owed 29000 MiB; b (older) and c (younger) each 10000 MiB above their 5000 MiB requests; another process
    (not of a fractional container) holds 20000: 5000 free, 24000 short."""
    node.add_pod("a", 1, request_mib=30000, limit_mib=30000, started="2026-01-01T00:00:00Z")
    node.add_pod("b", 2, request_mib=5000, limit_mib=60000, started="2026-01-01T01:00:00Z")
    node.add_pod("c", 3, request_mib=5000, limit_mib=60000, started="2026-01-01T02:00:00Z")
    for n, uid, pid in ((1, "u-a", 4001), (2, "u-b", 4002), (3, "u-c", 4003)):
        node.proc.add(pid, cid(n), env_for("time-slicing", 60000, 5000, UUID_A), pod_uid=uid)
    node.proc.add(9000, cid(90), {}, pod_uid="u-not-a-fraction")  # a process of no fraction: no tenant's memory
    node.gpus.processes(UUID_A, [{"pid": 4001, "used_memory_mib": 1000}, {"pid": 4002, "used_memory_mib": 15000},
                                 {"pid": 4003, "used_memory_mib": 15000}, {"pid": 9000, "used_memory_mib": 44000}])


def test_each_eviction_follows_a_fresh_reading(node):
    three_above(node)
    evict = node.kube.request_eviction

    def evict_and_the_other_process_ends(namespace: str, name: str, **options: Any) -> Any:
        node.gpus.processes(UUID_A, [{"pid": 4001, "used_memory_mib": 1000},
                                     {"pid": 4002, "used_memory_mib": 15000},
                                     {"pid": 4003, "used_memory_mib": 15000}])  # 44000 MiB freed meanwhile
        return evict(namespace, name, **options)

    node.kube.request_eviction = evict_and_the_other_process_ends
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT))
    agent.tick()
    # on the first reading, c (the youngest) alone does not cover the 24000 short and b would follow; the reading
    # taken after c's eviction shows the owed memory fitting: b stays
    assert node.kube.evictions == [("team-a", "c")]
    assert node.events("GPUMemoryGuaranteeShort") == []


def test_a_refused_eviction_moves_on_to_the_next_candidate(node):
    three_above(node)
    node.kube.blocked.add("c")
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT))
    agent.tick()
    assert node.kube.evictions == [("team-a", "b")]  # c's budget refused it: b is tried, not given up on
    assert value(agent.metrics, "gpufrac_reclaims_total", outcome="blocked") == 1
    [short] = node.events("GPUMemoryGuaranteeShort")  # b's 15000 MiB do not cover 24000
    assert "evictions refused for team-a/c" in short["message"]


def test_a_shortage_must_last_the_window(node):
    contended(node)
    now = [1000.0]
    agent_config = reclaiming(ReclaimPolicy.EVICT, grace=30.0)
    agent = node.agent(agent_config)
    agent.audit.guarantee.reclaimer._clock = lambda: now[0]
    fits = [{"pid": 4001, "used_memory_mib": 10000}, {"pid": 4002, "used_memory_mib": 40000}]  # 30000 free
    short = [{"pid": 4001, "used_memory_mib": 10000}, {"pid": 4002, "used_memory_mib": 55000}]
    for at, processes in ((1000.0, short), (1015.0, fits), (1030.0, short), (1045.0, fits), (1060.0, short)):
        now[0] = at
        node.gpus.processes(UUID_A, processes)
        agent.tick()
    assert node.kube.evictions == []  # spikes 30 s apart: never a sustained shortage
    for at in (1075.0, 1090.0):
        now[0] = at
        agent.tick()
    assert node.kube.evictions == [("team-a", "b")]  # short on every pass from 1060 to 1090: 30 s


def test_kill_newest_does_not_kill_a_killed_process_again_while_nvml_still_lists_it(node):
    node.add_pod("train", 1, request_mib=20000, limit_mib=20000)
    older = node.live_process(1, "u-train", 12000, 20000)
    time.sleep(0.1)
    newer = node.live_process(1, "u-train", 11000, 20000)
    agent = node.agent(GuaranteeConfig(OverLimitAction.KILL_NEWEST))
    agent.tick()
    stat = Path(f"/proc/{newer.pid}/stat")
    wait_until(lambda: stat.read_text().rsplit(")", 1)[1].split()[0] == "Z", 10, "the newest process killed")
    agent.tick()  # not reaped yet: NVML still lists it (as a driver does until its memory is released)
    assert len(node.events("GPUProcessKilled")) == 1
    assert value(agent.metrics, "gpufrac_over_limit_actions_total", action="kill-newest", outcome="killed") == 1
    assert older.poll() is None


# ---- a DRA claim's share, held like an annotated fraction ----

CLAIM_POD_UID = "0a1b2c3d-1111-2222-3333-444455556666"


def claim_on_a(node, request_mib: int, limit_mib: int, *, priority: int | None = None) -> ClaimTenants:
    """A time-slicing claim on GPU A prepared for pod `claimed` (which gpufrac did not label: the agent's pod list
    does not hold it, the API server does)."""
    body = running_pod("claimed", uid=CLAIM_POD_UID, containers={"app": cid(9)}, annotations={})
    body["status"]["startTime"] = "2026-01-01T02:00:00Z"
    if priority is not None:
        body["spec"]["priority"] = priority
    node.kube.pods.append(body)
    device = PreparedDevice(request="gpu", pool=NODE, device="gpu-0-time-slicing", share_id="s", gpu_index=0,
                            gpu_uuid=UUID_A, mode="time-slicing", request_mib=request_mib, limit_mib=limit_mib,
                            compute_percent=100, cdi_ids=("gpu.gpufrac.io/claim=uid-c-gpu-0-time-slicing",),
                            env=(f"NVIDIA_GPU_MEMORY_REQUEST={request_mib}", f"NVIDIA_GPU_MEMORY_LIMIT={limit_mib}"))
    return claim_tenants([PreparedClaim(ClaimRef("team-a", "claimed-gpu", "uid-c"), (device,),
                                        (ClaimPod("claimed", CLAIM_POD_UID),))])


def test_a_claim_above_its_request_is_reclaimed_for_an_annotated_pod_and_its_use_is_in_the_metrics(node):
    node.add_pod("a", 1, request_mib=30000, limit_mib=30000)
    claims = claim_on_a(node, 10000, 60000)
    node.proc.add(4001, cid(1), env_for("time-slicing", 30000, 30000, UUID_A), pod_uid="u-a")
    node.proc.add(4009, cid(9), {"NVIDIA_GPU_MEMORY_REQUEST": "10000", "NVIDIA_GPU_MEMORY_LIMIT": "60000"},
                  pod_uid=CLAIM_POD_UID)
    node.gpus.processes(UUID_A, [{"pid": 4001, "used_memory_mib": 10000, "sm_util": 5},
                                 {"pid": 4009, "used_memory_mib": 55000, "sm_util": 50}])
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT), doors=[placing(claims)])
    agent.tick()
    assert node.kube.evictions == [("team-a", "claimed")]
    [on_claimed] = node.events("GPUMemoryReclaimed")
    assert on_claimed["involvedObject"]["uid"] == CLAIM_POD_UID
    assert "it uses 55000 MiB there, 45000 MiB above its requests" in on_claimed["message"]
    labels = {"namespace": "team-a", "pod": "claimed", "container": "claimed-gpu/gpu", "UUID": UUID_A,
              "Hostname": NODE}
    assert value(agent.metrics, "gpufrac_container_gpu_memory_used_bytes", **labels) == 55000 * MIB
    assert value(agent.metrics, "gpufrac_container_gpu_memory_limit_bytes", **labels) == 60000 * MIB
    assert node.events("GPULimitEnvMissing") == [] and node.events("GPULimitEnvMismatch") == []


def test_a_claim_owed_its_request_gets_an_annotated_burster_evicted_and_a_protected_claim_pod_is_not_a_victim(node):
    node.add_pod("b", 2, request_mib=10000, limit_mib=60000)
    claims = claim_on_a(node, 30000, 30000)  # prepared, its container not started yet: owed all of its request
    node.proc.add(4002, cid(2), env_for("time-slicing", 60000, 10000, UUID_A), pod_uid="u-b")
    node.gpus.processes(UUID_A, [{"pid": 4002, "used_memory_mib": 60000}])
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT), doors=[placing(claims)])
    agent.tick()
    assert node.kube.evictions == [("team-a", "b")]
    [on_claimed] = node.events("GPUMemoryReclaimedFor")
    assert on_claimed["involvedObject"]["name"] == "claimed" and "fieldPath" not in on_claimed["involvedObject"]
    assert "30000 MiB of its 30000 MiB request not yet used, 20000 MiB free" in on_claimed["message"]


def test_a_claim_pods_priority_is_read_from_the_api_server(node):
    node.add_pod("a", 1, request_mib=30000, limit_mib=30000)
    claims = claim_on_a(node, 10000, 60000, priority=2000)
    node.proc.add(4001, cid(1), env_for("time-slicing", 30000, 30000, UUID_A), pod_uid="u-a")
    node.proc.add(4009, cid(9), {}, pod_uid=CLAIM_POD_UID)
    node.gpus.processes(UUID_A, [{"pid": 4001, "used_memory_mib": 10000},
                                 {"pid": 4009, "used_memory_mib": 55000}])
    guarantee = reclaiming(ReclaimPolicy.EVICT)
    agent = node.agent(replace(guarantee, reclaim=replace(guarantee.reclaim, protected_priority=1000)),
                       doors=[placing(claims)])
    agent.tick()
    assert node.kube.evictions == []
    [short] = node.events("GPUMemoryGuaranteeShort")
    assert "no pod uses more than its request there that may be evicted" in short["message"]


# ---- the findings of issue 45: reclaim evicts only when a request truly cannot be met, once, failing closed ----

RS_B = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "b-5d9f", "uid": "u-rs-b", "controller": True}


def test_f1_use_charged_to_no_tenant_is_counted_once_against_the_gpu_not_again_as_owed(node):
    """D requests 30000 and uses 30000 through a process whose cgroup cannot be read (as NVML usage it has not told,
    or a client charged to its MPS server); E requests 10000 and uses 30000; 20000 free. Every request fits: D's
    30000 left `free` already, so it is not owed again; nobody is evicted."""
    node.add_pod("d", 1, request_mib=30000, limit_mib=30000, started="2026-01-01T00:00:00Z")
    node.add_pod("e", 2, request_mib=10000, limit_mib=60000, started="2026-01-01T01:00:00Z")
    node.proc.add(4002, cid(2), env_for("time-slicing", 60000, 10000, UUID_A), pod_uid="u-e")
    node.gpus.processes(UUID_A, [{"pid": 4001, "used_memory_mib": 30000},  # no /proc entry: its cgroup is unread
                                 {"pid": 4002, "used_memory_mib": 30000}])
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT))
    agent.tick()
    agent.tick()
    assert node.kube.evictions == []
    gpu = {"UUID": UUID_A, "Hostname": NODE, "modelName": "NVIDIA H200"}
    assert value(agent.metrics, "gpufrac_gpu_memory_guarantee_shortfall_bytes", **gpu) == 0
    # a process of no fraction is no tenant's: its use is not taken off what is owed
    node.proc.add(4001, cid(90), {}, pod_uid="u-not-a-fraction")
    agent.tick()
    assert node.kube.evictions == [("team-a", "e")]


def test_f2_nothing_is_owed_to_a_container_the_node_refuses(node):
    """A (30000) uses 40000, B (40000) uses 30000: B's 10000 fit in the 10000 free. C (20000) is bound but its
    container is refused at creation (90000 requested of 80000 usable): C is owed nothing, A stays."""
    node.add_pod("a", 1, request_mib=30000, limit_mib=60000, started="2026-01-01T01:00:00Z")
    node.add_pod("b", 2, request_mib=40000, limit_mib=40000)
    c = node.add_pod("c", 3, request_mib=20000, limit_mib=20000)
    del c["status"]["containerStatuses"][0]["containerID"]  # never created: the NRI plugin refused it
    c["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "CreateContainerError"}}
    node.proc.add(4001, cid(1), env_for("time-slicing", 60000, 30000, UUID_A), pod_uid="u-a")
    node.proc.add(4002, cid(2), env_for("time-slicing", 40000, 40000, UUID_A), pod_uid="u-b")
    node.gpus.processes(UUID_A, [{"pid": 4001, "used_memory_mib": 40000}, {"pid": 4002, "used_memory_mib": 30000}])
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT))
    agent.tick()
    agent.tick()
    assert node.kube.evictions == []
    # once B is gone C fits (30000 + 20000 of 80000): it is owed again, and A above its request is the victim
    node.kube.pods.remove(next(p for p in node.kube.pods if p["metadata"]["name"] == "b"))
    node.gpus.processes(UUID_A, [{"pid": 4001, "used_memory_mib": 70000}])
    agent.pods.relist()
    agent.tick()
    assert node.kube.evictions == [("team-a", "a")]


def test_f3_one_eviction_per_pod_per_pass_across_gpus(node):
    """X uses more than its request on GPU A and on GPU B, where a and c are each owed: one eviction frees both."""
    node.add_pod("a", 1, request_mib=30000, limit_mib=30000)
    node.add_pod("c", 3, request_mib=30000, limit_mib=30000, gpu=UUID_B)
    x = pod("x", uid="u-x", containers={"app": cid(2)}, annotations=canonical_annotations(
        "app", request_mib=10000, limit_mib=70000, devices=[UUID_A, UUID_B]))
    node.kube.pods.append(x)
    node.proc.add(4001, cid(1), env_for("time-slicing", 30000, 30000, UUID_A), pod_uid="u-a")
    node.proc.add(4003, cid(3), env_for("time-slicing", 30000, 30000, UUID_B), pod_uid="u-c")
    node.proc.add(4002, cid(2), env_for("time-slicing", 70000, 10000, UUID_A), pod_uid="u-x")
    node.gpus.processes(UUID_A, [{"pid": 4001, "used_memory_mib": 1000}, {"pid": 4002, "used_memory_mib": 60000}])
    node.gpus.processes(UUID_B, [{"pid": 4003, "used_memory_mib": 1000}, {"pid": 4002, "used_memory_mib": 60000}])
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT))
    agent.tick()
    assert node.kube.evictions == [("team-a", "x")]
    assert len(node.events("GPUMemoryReclaimed")) == 1
    assert value(agent.metrics, "gpufrac_reclaims_total", outcome="evicted") == 1
    assert node.events("GPUMemoryGuaranteeShort") == []  # on GPU B too, x going covers c's request


def test_f3_over_limit_evict_and_reclaim_evict_the_same_pod_once(node):
    contended(node)
    b = node.kube.pods[1]
    b["metadata"]["annotations"] = canonical_annotations("app", request_mib=10000, limit_mib=50000, devices=[UUID_A])
    agent = node.agent(replace(reclaiming(ReclaimPolicy.EVICT), over_limit_action=OverLimitAction.EVICT))
    agent.tick()
    assert node.kube.evictions == [("team-a", "b")]  # over its limit (55000 of 50000) and the reclaim victim
    assert len(node.events("GPUMemoryLimitEvicted")) == 1 and node.events("GPUMemoryReclaimed") == []


def test_f4_a_back_off_label_that_cannot_be_written_means_no_eviction(node):
    contended(node)
    node.kube.pods[1]["metadata"]["ownerReferences"] = [RS_B]
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT))
    node.kube.label_error = KubeError("labelling node gpu-node-1: 503 Service Unavailable")
    agent.tick()
    assert node.kube.evictions == []
    assert value(agent.metrics, "gpufrac_reclaims_total", outcome="not-kept-off") == 1
    [event] = node.events("GPUReclaimNotEvicted")
    assert event["involvedObject"]["name"] == "b" and "could not be written" in event["message"]
    assert node.events("GPUMemoryReclaimedFromPod") == []  # nothing says the pod is kept off
    node.kube.label_error = None  # the API server answers again: evicted then, with its back-off
    agent.tick()
    assert node.kube.evictions == [("team-a", "b")] and reclaim_backoff_label("u-rs-b") in node.kube.labels


def test_f4_a_claims_pod_gets_no_back_off_label(node):
    """A claim's pods take their GPUs through DRA: the webhook gives them no back-off affinity, so no label is
    written for their controller; its Event says a replacement may come back."""
    node.add_pod("a", 1, request_mib=30000, limit_mib=30000)
    claims = claim_on_a(node, 10000, 60000)
    node.kube.pods[-1]["metadata"]["ownerReferences"] = [RS_B]
    node.proc.add(4001, cid(1), env_for("time-slicing", 30000, 30000, UUID_A), pod_uid="u-a")
    node.proc.add(4009, cid(9), {}, pod_uid=CLAIM_POD_UID)
    node.gpus.processes(UUID_A, [{"pid": 4001, "used_memory_mib": 10000}, {"pid": 4009, "used_memory_mib": 55000}])
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT), doors=[placing(claims)])
    agent.tick()
    assert node.kube.evictions == [("team-a", "claimed")]
    assert reclaim_backoff_label("u-rs-b") not in node.kube.labels
    assert not any(reclaim_backoff_label("u-rs-b") in patch for patch in node.kube.label_patches)
    [on_owner] = node.events("GPUMemoryReclaimedFromPod")
    assert "which no back-off label keeps off" in on_owner["message"]


def test_f5_a_claim_pod_that_cannot_be_read_is_not_evicted(node):
    node.add_pod("a", 1, request_mib=30000, limit_mib=30000)
    claims = claim_on_a(node, 10000, 60000, priority=2000)  # protected, as the API server would have said
    node.proc.add(4001, cid(1), env_for("time-slicing", 30000, 30000, UUID_A), pod_uid="u-a")
    node.proc.add(4009, cid(9), {}, pod_uid=CLAIM_POD_UID)
    node.gpus.processes(UUID_A, [{"pid": 4001, "used_memory_mib": 10000}, {"pid": 4009, "used_memory_mib": 55000}])
    node.kube.pod_errors["claimed"] = KubeError("reading pod team-a/claimed: 503 Service Unavailable")
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT), doors=[placing(claims)])
    agent.tick()
    assert node.kube.evictions == []
    assert value(agent.metrics, "gpufrac_reclaims_total", outcome="unread") == 1
    [event] = node.events("GPUReclaimPodUnread")
    assert event["involvedObject"]["uid"] == CLAIM_POD_UID and "503 Service Unavailable" in event["message"]


def test_f6_a_pod_being_deleted_is_owed_nothing(node):
    """A (30000) is being deleted and its process still holds 10000; B uses 55000: nothing is owed to A."""
    contended(node)
    node.kube.pods[0]["metadata"]["deletionTimestamp"] = "2026-01-01T02:00:00Z"
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT))
    agent.tick()
    agent.tick()
    assert node.kube.evictions == []
    assert node.events("GPUMemoryGuaranteeShort") == []


def test_f7_every_eviction_names_the_pods_uid_and_the_victims_grace_period(node):
    contended(node)
    guarantee = reclaiming(ReclaimPolicy.EVICT)
    agent = node.agent(replace(guarantee, reclaim=replace(guarantee.reclaim, victim_grace_seconds=7)))
    agent.tick()
    assert node.kube.evictions == [("team-a", "b")]
    assert node.kube.eviction_options == [{"name": "b", "uid": "u-b", "grace_seconds": 7}]


def test_f7_a_pod_of_the_same_name_made_since_is_not_evicted(node):
    """The UID precondition: the pod the agent chose was replaced by one of the same name (a StatefulSet's)."""
    contended(node)
    evict = node.kube.request_eviction

    def replaced_meanwhile(namespace: str, name: str, **options: Any) -> Any:
        node.kube.pods[1]["metadata"]["uid"] = "u-b-replacement"  # deleted and made again since the reading
        return evict(namespace, name, **options)

    node.kube.request_eviction = replaced_meanwhile
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT))
    agent.tick()
    assert node.kube.evictions == []
    assert node.kube.eviction_options[0]["uid"] == "u-b"
    assert value(agent.metrics, "gpufrac_reclaims_total", outcome="failed") == 1


def test_mps_clients_charged_to_their_server_get_nobody_evicted_needlessly(node):
    """A driver that charges MPS clients' memory to their server (the fake's "mps_memory": "server"; gpucheck's row 6c
    says which way a real one goes): NVML lists D's and E's processes with no usage, and the agent's MPS server with
    all of it. D requests 30000 and uses 30000, E requests 10000 and uses 30000, 20000 free: every request fits.
    Nobody is evicted, as when each client is listed with its own memory."""
    node.add_pod("d", 1, request_mib=30000, limit_mib=30000, started="2026-01-01T00:00:00Z")
    node.add_pod("e", 2, request_mib=10000, limit_mib=60000, started="2026-01-01T01:00:00Z")
    node.proc.add(4001, cid(1), env_for("sm-sharing", 30000, 30000, UUID_A), pod_uid="u-d")
    node.proc.add(4002, cid(2), env_for("sm-sharing", 60000, 10000, UUID_A), pod_uid="u-e")
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT))
    agent.tick()  # the agent's MPS control daemons start
    daemons = [s.pid for s in agent.daemons.statuses().values() if s.pid]
    node.proc.add_program(4300, ["nvidia-cuda-mps-server"])
    write_stat(node.proc, 4300, parent=daemons[0])  # the agent's daemon's server
    node.gpus.charge_mps_clients_to_server(UUID_A)
    node.gpus.processes(UUID_A, [{"pid": 4300, "used_memory_mib": 0},
                                 {"pid": 4001, "used_memory_mib": 30000, "mps_server": 4300},
                                 {"pid": 4002, "used_memory_mib": 30000, "mps_server": 4300}])
    import pynvml
    [client, *_] = [p for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(0))
                    if p.pid == 4001]
    assert client.usedGpuMemory is None  # the fake reports it as such a driver would
    agent.tick()
    agent.tick()
    assert node.kube.evictions == []
    gpu = {"UUID": UUID_A, "Hostname": NODE, "modelName": "NVIDIA H200"}
    assert value(agent.metrics, "gpufrac_gpu_memory_guarantee_shortfall_bytes", **gpu) == 0
    # the same GPU with each client listed with its own memory: the same answer
    node.gpus.state["gpus"][0].pop("mps_memory")
    node.gpus.write()
    agent.tick()
    assert node.kube.evictions == []


def test_where_the_driver_holds_requests_a_process_gone_while_above_its_request_gets_an_event(node, tmp_path):
    """The driver kills a process above its soft limit with no grace and no word: the agent says it, on the pod."""
    contended(node)
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc dmem\n")
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT))
    agent.tick()
    agent.tick()
    assert node.events("GPUProcessEndedAboveRequest") == []  # still running: nothing to say
    node.gpus.processes(UUID_A, [{"pid": 4001, "used_memory_mib": 30000}])  # B's process is gone, A took its room
    agent.tick()
    [event] = node.events("GPUProcessEndedAboveRequest")
    assert event["involvedObject"]["name"] == "b" and event["type"] == "Warning"
    assert "GPU process 4002 ended while its container used 55000 MiB" in event["message"]
    assert "45000 MiB above its request of 10000 MiB" in event["message"]
    assert value(agent.metrics, "gpufrac_reclaims_total", outcome="driver-ended") == 1
    assert node.events("GPUProcessEndedAboveRequest")[0]["involvedObject"]["fieldPath"] == "spec.containers{app}"
    agent.tick()
    assert value(agent.metrics, "gpufrac_reclaims_total", outcome="driver-ended") == 1  # said once
    assert node.kube.evictions == []


def test_a_gang_member_is_spared_while_its_sub_group_is_at_its_minimum(node):
    """KAI 0.18's PodGroup `train` (minMember 3, four running) has sub-groups `workers` (minMember 2) and `ps`
    (minMember 1); B and C are workers here, a third worker and one ps run elsewhere. The gang can lose one, and so
    can `workers` with three running; with only B and C running there, neither is evicted, whatever the gang can
    lose; with the sub-group's pods unlisted, neither is."""
    contended(node)
    node.add_pod("c", 3, request_mib=1000, limit_mib=20000, started="2026-01-01T02:00:00Z")
    node.proc.add(4003, cid(3), env_for("time-slicing", 20000, 1000, UUID_A), pod_uid="u-c")
    node.gpus.processes(UUID_A, [{"pid": 4001, "used_memory_mib": 10000}, {"pid": 4002, "used_memory_mib": 45000},
                                 {"pid": 4003, "used_memory_mib": 10000}])
    for body in node.kube.pods[1:]:
        body["metadata"]["annotations"]["pod-group-name"] = "train"
        body["metadata"]["labels"]["kai.scheduler/subgroup-name"] = "workers"
    elsewhere = running_pod("w-3", uid="u-w3", containers={"app": cid(7)}, annotations={"pod-group-name": "train"},
                            node="gpu-node-2", labels={"kai.scheduler/subgroup-name": "workers"})
    node.kube.pod_groups[("team-a", "train")] = {
        "spec": {"minMember": 3, "subGroups": [{"name": "workers", "minMember": 2}, {"name": "ps", "minMember": 1}]},
        "status": {"running": 4}}
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT))
    agent.tick()
    assert node.kube.evictions == []  # workers: 2 running of minMember 2
    [short] = node.events("GPUMemoryGuaranteeShort")
    assert "needed by its gang at its minimum" in short["message"]
    node.kube.pods.append(elsewhere)  # a third worker runs on another node
    node.kube.list_error = KubeError("pods is forbidden")
    agent.tick()
    assert node.kube.evictions == []  # the sub-group's members not known: none is evicted
    node.kube.list_error = None
    agent.tick()
    assert node.kube.evictions == [("team-a", "c")]  # one worker to spare: the youngest


def test_off_reports_only_the_pods_it_would_evict(node):
    """Two pods above their requests; the youngest alone covers the shortage: only it would be evicted."""
    contended(node)
    node.add_pod("c", 3, request_mib=1000, limit_mib=20000, started="2026-01-01T02:00:00Z")
    node.proc.add(4003, cid(3), env_for("time-slicing", 20000, 1000, UUID_A), pod_uid="u-c")
    node.gpus.processes(UUID_A, [{"pid": 4001, "used_memory_mib": 10000}, {"pid": 4002, "used_memory_mib": 45000},
                                 {"pid": 4003, "used_memory_mib": 10000}])  # 15000 free, 20000 owed: 5000 short
    agent = node.agent(reclaiming(ReclaimPolicy.OFF))
    agent.tick()
    assert [e["involvedObject"]["name"] for e in node.events("GPUReclaimWouldEvict")] == ["c"]
    assert value(agent.metrics, "gpufrac_reclaims_total", outcome="would-evict") == 1


def test_a_refused_eviction_keeps_the_controllers_running_back_off(node):
    """B and C are pods of one ReplicaSet. B is evicted: the ReplicaSet's back-off runs. C's eviction, refused by a
    PodDisruptionBudget, must leave that back-off as it was, not take it off."""
    contended(node)
    node.add_pod("c", 3, request_mib=1000, limit_mib=20000, started="2026-01-01T02:00:00Z")
    node.proc.add(4003, cid(3), env_for("time-slicing", 20000, 1000, UUID_A), pod_uid="u-c")
    node.gpus.processes(UUID_A, [{"pid": 4001, "used_memory_mib": 10000}, {"pid": 4002, "used_memory_mib": 45000},
                                 {"pid": 4003, "used_memory_mib": 10000}])
    for body in node.kube.pods[1:]:
        body["metadata"]["ownerReferences"] = [RS_B]
    now = [1_800_000_000.0]
    agent = node.agent(reclaiming(ReclaimPolicy.EVICT), wall_clock=lambda: now[0])
    node.kube.blocked.add("c")
    agent.tick()  # c (the youngest) refused, b evicted: the back-off runs from now
    assert node.kube.evictions == [("team-a", "b")]
    label = reclaim_backoff_label("u-rs-b")
    assert node.kube.labels[label] == "1800000600"
    node.kube.pods[1]["metadata"]["deletionTimestamp"] = "2026-01-01T03:00:00Z"  # b going; c still above, refused
    node.gpus.processes(UUID_A, [{"pid": 4001, "used_memory_mib": 10000}, {"pid": 4003, "used_memory_mib": 60000}])
    agent.pods.relist()
    now[0] += 100
    agent.tick()
    assert node.kube.evictions == [("team-a", "b")]
    assert node.kube.labels[label] == "1800000600"  # the running back-off, as it was
