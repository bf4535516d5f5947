"""The agent's loop end to end in one process: real pynvml over the fake libnvidia-ml.so.1, the fake MPS daemon,
a fake /proc, and an in-memory Kubernetes API. Metrics are checked by scraping the registry text."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from e2e.toolkit.wait import wait_until
from gpufrac.agent.csi.service import node_dirs
from gpufrac.agent.programs.node_agent import probe_server
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import MIB
from testkit.agent import UUID_A, UUID_B, FakeNode, cid, env_for, scrape, value

# KAI's two names for the node condition its NvFractions mode gates placement on: the agent must publish both.
KAI_TYPES = ("gpu-sharing.nvidia.com/Ready", "gpu-fractioning.nvidia.com/Ready")


@pytest.fixture
def world(fake_node: FakeNode) -> FakeNode:
    return fake_node


def test_labels_condition_and_daemons(world):
    agent = world.start_agent()
    agent.tick()
    wait_until(lambda: all(s.up for s in agent.daemon_statuses().values()) and len(agent.daemon_statuses()) == 2)
    agent.tick()
    assert world.kube.labels == {
        "gpufrac.io/driver-version.major": "615", "gpufrac.io/gpu-count": "2",
        "gpufrac.io/enforcement.time-slicing": "driver", "gpufrac.io/enforcement.sm-sharing": "driver",
        "gpufrac.io/boundary.time-slicing": "hard", "gpufrac.io/boundary.sm-sharing": "hard",
        "gpufrac.io/gpu-memory-usable-mib.NVIDIA-H200": "80000"}  # no reserve in the fake's state, no MPS server
    last = world.kube.last_condition()
    assert (last["type"], last["status"], last["reason"]) == ("gpufrac.io/Ready", "True", "FractionsEnforced")
    for kai_type in KAI_TYPES:  # both names of KAI's NvFractions gate follow ours
        kai = world.kube.last_condition(kai_type)
        assert (kai["status"], kai["reason"], kai["message"]) == ("True", "FractionsEnforced", last["message"]), \
            kai_type
    assert node_dirs(agent).not_served == dict.fromkeys(ComputeMode)
    for mode in ("time-slicing", "sm-sharing"):
        assert value(agent.metrics, "gpufrac_mps_daemon_up", mode=mode) == 1
        assert (world.tmp / "mps" / mode / "control").is_socket()
    assert value(agent.metrics, "gpufrac_node_enforcement", mode="sm-sharing", enforcement="driver") == 1
    ok, _ = agent.readyz()
    assert ok
    # unchanged state: no new condition patch (only on change or heartbeat)
    patches = len(world.kube.conditions)
    agent.tick()
    assert len(world.kube.conditions) == patches


def test_old_driver_labels_and_only_the_sm_sharing_daemon(world):
    world.gpus.set(driver_version="550.54.15", cuda_driver_version=12040)
    stale = world.tmp / "mps" / "time-slicing" / "control"  # from a daemon under a former r615 driver
    stale.parent.mkdir(parents=True)
    stale.write_text("")
    agent = world.start_agent()
    agent.tick()
    wait_until(lambda: agent.daemon_statuses()[ComputeMode.SM_SHARING].up)
    agent.tick()
    assert set(agent.daemon_statuses()) == {ComputeMode.SM_SHARING}
    assert world.kube.labels["gpufrac.io/enforcement.time-slicing"] == "none"
    assert world.kube.labels["gpufrac.io/enforcement.sm-sharing"] == "mps"
    assert world.kube.labels["gpufrac.io/driver-version.major"] == "550"
    last = world.kube.last_condition()
    assert (last["status"], last["reason"]) == ("True", "DriverWithoutMemoryLimits")  # sm-sharing is enforced
    assert not stale.exists()


def test_usage_metrics_per_fraction(world):
    world.proc.add(4242, cid(1), env_for("time-slicing", 20000, 20000, UUID_A))
    world.proc.add(4343, cid(1), env_for("time-slicing", 20000, 20000, UUID_A), form="v1-cgroupfs")
    world.proc.add(5151, cid(2), env_for("sm-sharing", 16000, 10000, UUID_B), form="v2-crio-systemd")
    world.proc.add(9999, cid(9), {})  # a process of some non-fractional container
    world.gpus.processes(UUID_A, [{"pid": 4242, "used_memory_mib": 2048, "sm_util": 10},
                                  {"pid": 4343, "used_memory_mib": 1024, "sm_util": 5},
                                  {"pid": 9999, "used_memory_mib": 512, "sm_util": 50}])
    world.gpus.processes(UUID_B, [{"pid": 5151, "used_memory_mib": 4096, "sm_util": 12}])
    agent = world.start_agent()
    agent.tick()
    m = agent.metrics
    train = {"namespace": "team-a", "pod": "train", "container": "app", "UUID": UUID_A, "Hostname": "gpu-node-1"}
    infer = {"namespace": "team-a", "pod": "infer", "container": "worker", "UUID": UUID_B, "Hostname": "gpu-node-1"}
    assert value(m, "gpufrac_container_gpu_memory_used_bytes", **train) == 3072 * MIB
    assert value(m, "gpufrac_container_gpu_memory_limit_bytes", **train) == 20000 * MIB
    assert value(m, "gpufrac_container_gpu_sm_utilization_ratio", **train) == pytest.approx(0.15)
    assert value(m, "gpufrac_container_gpu_sm_utilization_normalized_ratio", **train) == pytest.approx(0.15 / 0.25)
    assert value(m, "gpufrac_container_gpu_memory_used_bytes", **infer) == 4096 * MIB
    assert value(m, "gpufrac_container_gpu_memory_limit_bytes", **infer) == 16000 * MIB
    assert value(m, "gpufrac_container_gpu_sm_utilization_normalized_ratio", **infer) == pytest.approx(0.12 / 0.125)
    used = [k for k in scrape(m) if k[0] == "gpufrac_container_gpu_memory_used_bytes"]
    assert len(used) == 2  # the non-fractional process is nobody's fraction
    assert agent.violations == []
    assert world.kube.events == {}
    # a pod that goes away takes its series with it
    world.kube.pods.pop(1)
    agent.pods.relist()
    agent.tick()
    assert value(m, "gpufrac_container_gpu_memory_used_bytes", **infer) is None


def test_a_pod_whose_canonical_values_do_not_parse_is_counted(world):
    agent = world.start_agent()
    agent.tick()
    assert value(agent.metrics, "gpufrac_unreadable_canonical_containers") == 0
    world.kube.pods[1]["metadata"]["annotations"]["gpufrac.io/container.worker.gpu-memory.limit-mib"] = "16Gi"
    agent.pods.relist()
    agent.tick()
    assert value(agent.metrics, "gpufrac_unreadable_canonical_containers") == 1


def test_over_limit_becomes_one_event_even_across_agent_restarts(world):
    world.proc.add(4242, cid(1), env_for("time-slicing", 20000, 20000, UUID_A))
    world.gpus.processes(UUID_A, [{"pid": 4242, "used_memory_mib": 25000, "sm_util": 90}])
    agent = world.start_agent()
    agent.tick()
    agent.tick()
    [event] = world.kube.events.values()
    assert event["reason"] == "GPUMemoryLimitExceeded" and event["type"] == "Warning"
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "team-a", "name": "train",
                                       "uid": "u-train", "fieldPath": "spec.containers{app}"}
    assert "uses 25000 MiB" in event["message"] and "limit of 20000 MiB" in event["message"]
    assert event["source"] == {"component": "gpufrac-agent", "host": "gpu-node-1"}
    assert value(agent.metrics, "gpufrac_violations_total", kind="memory-over-limit") == 1
    calls = world.kube.create_event_calls
    agent.tick()
    assert world.kube.create_event_calls == calls  # remembered: not even re-sent
    # a restarted agent tries once, finds the event by its name, and adds nothing
    agent.shutdown()
    again = world.start_agent()
    again.tick()
    again.tick()
    assert len(world.kube.events) == 1
    assert value(again.metrics, "gpufrac_violations_total", kind="memory-over-limit") == 0
    assert world.kube.evictions == []


def test_missing_env_and_eviction(world):
    env = env_for("time-slicing", 20000, 20000, UUID_A)
    del env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]
    world.proc.add(4242, cid(1), env)
    world.gpus.processes(UUID_A, [{"pid": 4242, "used_memory_mib": 100, "sm_util": 1}])
    agent = world.start_agent(evict_on_violation=True)
    agent.tick()
    agent.tick()
    [event] = world.kube.events.values()
    assert event["reason"] == "GPULimitEnvMissing"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in event["message"]
    assert world.kube.evictions == [("team-a", "train")]  # once, though seen on two loops


def test_an_sm_sharing_process_without_its_binds_active_thread_percentage_is_an_event(world):
    """The compute portion the bind wrote (here 0.5: active-thread-percent 50) is checked like the memory limits, in
    the environ the agent reads from /proc."""
    infer = next(p for p in world.kube.pods if p["metadata"]["name"] == "infer")
    infer["metadata"]["annotations"]["gpufrac.io/container.worker.active-thread-percent"] = "50"
    world.proc.add(5151, cid(2), env_for("sm-sharing", 16000, 10000, UUID_B) |
                   {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"})
    world.proc.add(5252, cid(2), env_for("sm-sharing", 16000, 10000, UUID_B) |
                   {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"})
    world.gpus.processes(UUID_B, [{"pid": 5151, "used_memory_mib": 100}, {"pid": 5252, "used_memory_mib": 100}])
    agent = world.start_agent()
    agent.tick()
    [event] = world.kube.events.values()
    assert (event["involvedObject"]["name"], event["reason"]) == ("infer", "GPULimitEnvMismatch")
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 (expected 50)" in event["message"]


def test_mixed_modes_and_wrong_device(world):
    # the sm-sharing pod's process shows up on GPU A, where the time-slicing pod runs
    world.proc.add(4242, cid(1), env_for("time-slicing", 20000, 20000, UUID_A))
    world.proc.add(5151, cid(2), env_for("sm-sharing", 16000, 10000, UUID_B))
    world.gpus.processes(UUID_A, [{"pid": 4242, "used_memory_mib": 100}, {"pid": 5151, "used_memory_mib": 100}])
    agent = world.start_agent(evict_on_violation=True)
    agent.tick()
    reasons = sorted((e["involvedObject"]["name"], e["reason"]) for e in world.kube.events.values())
    assert reasons == [("infer", "GPUComputeModesMixed"), ("infer", "GPUDeviceNotAssigned"),
                       ("train", "GPUComputeModesMixed")]
    assert world.kube.evictions == [("team-a", "infer")]  # not for the scheduler's placement
    assert value(agent.metrics, "gpufrac_violations_total", kind="mixed-modes") == 2


def test_killed_daemon_is_restarted_and_counted(world):
    agent = world.start_agent()
    agent.tick()
    sup = agent.supervisors[ComputeMode.SM_SHARING]
    wait_until(lambda: sup.status().up)
    flag = sup.spec.log_dir / "fake-crash"
    flag.write_text("")
    wait_until(lambda: sup.status().restarts >= 1)
    flag.unlink()
    wait_until(lambda: sup.status().up)

    def counted() -> bool:  # a daemon started while the flag was there may still exit once more: tick again
        agent.tick()
        return value(agent.metrics, "gpufrac_mps_daemon_restarts_total", mode="sm-sharing") == sup.status().restarts
    wait_until(counted)
    assert sup.status().restarts >= 1
    assert value(agent.metrics, "gpufrac_mps_daemon_restarts_total", mode="time-slicing") == 0


def test_exhausted_daemon_makes_the_node_not_ready(world):
    agent = world.start_agent()
    (world.tmp / "log" / "sm-sharing").mkdir(parents=True)
    (world.tmp / "log" / "sm-sharing" / "fake-crash").write_text("")
    agent.tick()
    sup = agent.supervisors[ComputeMode.SM_SHARING]
    wait_until(lambda: str(sup.status().state) == "failed")
    agent.tick()
    last = world.kube.last_condition()
    assert (last["status"], last["reason"]) == ("False", "MpsDaemonFailed")
    assert "restarted 3 times in a row" in last["message"]
    for kai_type in KAI_TYPES:
        kai = world.kube.last_condition(kai_type)
        assert (kai["status"], kai["reason"], kai["message"]) == ("False", "MpsDaemonFailed", last["message"]), kai_type
    assert world.kube.labels["gpufrac.io/enforcement.sm-sharing"] == "none"
    ok, text = agent.readyz()
    assert not ok and "sm-sharing MPS daemon failed" in text
    dirs = node_dirs(agent)
    assert dirs.not_served[ComputeMode.TIME_SLICING] is None
    assert dirs.not_served[ComputeMode.SM_SHARING].startswith("its MPS control daemon is failed (exited with code 1")


def test_the_kai_condition_type_is_configurable_and_can_be_left_out(world):
    agent = world.start_agent(extra_condition_types=("gpu-fractioning.nvidia.com/Ready",))
    agent.tick()
    types = {c["type"] for c in world.kube.conditions}
    assert types == {"gpufrac.io/Ready", "gpu-fractioning.nvidia.com/Ready"}
    world.kube.conditions.clear()
    world.start_agent(extra_condition_types=()).tick()
    assert {c["type"] for c in world.kube.conditions} == {"gpufrac.io/Ready"}


def test_nvml_down_is_reported_not_fatal(world):
    world.gpus.set(error=9)
    agent = world.start_agent()
    agent.tick()
    last = world.kube.last_condition()
    assert (last["status"], last["reason"]) == ("False", "NvmlUnavailable")
    assert value(agent.metrics, "gpufrac_nvml_up") == 0
    assert agent.supervisors == {}
    world.gpus.state.pop("error")
    world.gpus.write()
    agent.tick()
    assert value(agent.metrics, "gpufrac_nvml_up") == 1
    assert set(agent.supervisors) == {ComputeMode.TIME_SLICING, ComputeMode.SM_SHARING}


def test_memory_budget_check(world):
    (world.tmp / "memory.max").write_text(str(128 * MIB))
    agent = world.start_agent()
    agent.tick()
    wait_until(lambda: all(s.up for s in agent.daemon_statuses().values()))
    agent.tick()
    last = world.kube.last_condition()
    assert (last["status"], last["reason"]) == ("False", "MpsMemoryBudgetTooSmall")
    assert "384Mi" in last["message"]  # 128Mi + 64Mi x 2 GPUs x 2 daemons


def test_shutdown_quits_daemons_and_marks_the_node_unknown(world):
    agent = world.start_agent()
    agent.tick()
    wait_until(lambda: all(s.up for s in agent.daemon_statuses().values()))
    sups = list(agent.supervisors.values())
    agent.shutdown()
    for sup in sups:
        text = (sup.spec.log_dir / "fake-mps-record.jsonl").read_text()
        assert '"command": "quit", "via": "stdin"' in text
        assert not sup.killed
    last = world.kube.last_condition()
    assert (last["status"], last["reason"]) == ("Unknown", "AgentStopped")
    for kai_type in KAI_TYPES:
        assert (world.kube.last_condition(kai_type)["status"], world.kube.last_condition(kai_type)["reason"]) == \
            ("Unknown", "AgentStopped"), kai_type
    assert world.kube.labels["gpufrac.io/enforcement.sm-sharing"] == "none"
    assert value(agent.metrics, "gpufrac_mps_daemon_up", mode="sm-sharing") == 0


def test_http_endpoints(world):
    agent = world.start_agent()
    server = probe_server("127.0.0.1:0", agent.metrics, agent)
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{base}/readyz", timeout=5)
        assert err.value.code == 503 and b"NVML" in err.value.read()
        agent.tick()
        wait_until(lambda: all(s.up for s in agent.daemon_statuses().values()))
        agent.tick()
        with urllib.request.urlopen(f"{base}/readyz", timeout=5) as resp:
            assert resp.read() == b"ok\n"
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as resp:
            body = resp.read().decode()
        assert 'gpufrac_mps_daemon_up{mode="sm-sharing"} 1.0' in body
        assert "gpufrac_watch_reconnects_total 0.0" in body
    finally:
        server.stop()
