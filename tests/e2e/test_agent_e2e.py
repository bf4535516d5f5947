"""The node agent against a real kube-apiserver: `gpufrac agent` runs as its own process with the GPU fakes
(fake libnvidia-ml.so.1 through pynvml, fake nvidia-cuda-mps-control, a fake /proc); pods are created by alice
through the webhook, bound by the scheduler's binder, and marked running by admin as the kubelet would."""

from __future__ import annotations

import os
import signal

import pytest

from e2e.agent_world import GPU_UUIDS, AgentWorld, metric_value
from e2e.testing import unique
from e2e.toolkit.wait import wait_until

pytestmark = pytest.mark.e2e

# A process's env without the limits the webhook injects: the agent reports it (GPULimitEnvMissing).
WITHOUT_LIMITS = {"PATH": "/usr/bin", "CUDA_MPS_PIPE_DIRECTORY": "/run/gpufrac/mps/time-slicing"}


@pytest.fixture(scope="module")
def world(cluster, tmp_path_factory):
    w = AgentWorld(cluster, tmp_path_factory.mktemp("agent-node"))
    w.start_agent()
    yield w
    try:
        w.stop_agent()
    finally:
        w.delete_pods(*w.created)


@pytest.fixture(autouse=True)
def _pods_in_the_tests_namespace(world, ns):
    """The module's node and agent serve every test; the pods each test makes are in its own namespace."""
    world.namespace = ns


def test_node_is_labelled_and_ready(world):
    def labelled():
        labels = world.get_node()["metadata"].get("labels", {})
        return labels.get("gpufrac.io/enforcement.sm-sharing") == "driver" and labels

    labels = wait_until(labelled, what="node labels")
    assert labels["gpufrac.io/driver-version.major"] == "615"
    assert labels["gpufrac.io/gpu-count"] == "2"
    assert labels["gpufrac.io/enforcement.time-slicing"] == "driver"
    cond = wait_until(lambda: (c := world.node_condition()) and c["status"] == "True" and c, what="condition")
    assert cond["reason"] == "FractionsEnforced"
    assert world.readyz() == (200, "ok\n")


def test_fractional_pods_appear_in_metrics_with_their_labels(world, ns):
    ts = world.create_pod(unique("agent-train"), gpu_uuid=GPU_UUIDS[0], limit_mib=40000, request_mib=35943)
    sm = world.create_pod(unique("agent-infer"), gpu_uuid=GPU_UUIDS[1], limit_mib=20000, mode="sm-sharing")
    world.start_process(ts, used_mib=3000, sm_util=20)
    world.start_process(ts, used_mib=1000, sm_util=5)
    world.start_process(sm, used_mib=512, sm_util=7)
    ts_labels = {"namespace": ns, "pod": ts.name, "container": "app", "UUID": GPU_UUIDS[0]}
    sm_labels = {"namespace": ns, "pod": sm.name, "container": "app", "UUID": GPU_UUIDS[1]}

    def scraped():
        text = world.metrics()
        used = metric_value(text, "gpufrac_container_gpu_memory_used_bytes", **ts_labels)
        return text if used == 4000 * 2**20 and metric_value(
            text, "gpufrac_container_gpu_memory_used_bytes", **sm_labels) == 512 * 2**20 else None

    text = wait_until(scraped, what="per-fraction metrics")
    assert metric_value(text, "gpufrac_container_gpu_memory_limit_bytes", **ts_labels) == 40000 * 2**20
    assert metric_value(text, "gpufrac_container_gpu_sm_utilization_ratio", **ts_labels) == pytest.approx(0.25)
    # request 35943 MiB of 143771 MiB is a quarter of the GPU
    assert metric_value(text, "gpufrac_container_gpu_sm_utilization_normalized_ratio",
                        **ts_labels) == pytest.approx(0.25 / (35943 / 143771))
    assert metric_value(text, "gpufrac_container_gpu_sm_utilization_ratio", **sm_labels) == pytest.approx(0.07)
    assert world.events_for(ts.name) == [] and world.events_for(sm.name) == []


def test_process_over_its_limit_yields_one_event_on_its_pod(world):
    fp = world.create_pod(unique("agent-greedy"), gpu_uuid=GPU_UUIDS[0], limit_mib=8000)
    pid = world.start_process(fp, used_mib=1000, sm_util=1)
    wait_until(lambda: metric_value(world.metrics(), "gpufrac_container_gpu_memory_used_bytes",
                                    pod=fp.name) == 1000 * 2**20, what="the process in metrics")
    world.set_process_memory(pid, 9000)
    [event] = wait_until(lambda: world.events_for(fp.name), what="an event")
    assert event["reason"] == "GPUMemoryLimitExceeded" and event["type"] == "Warning"
    assert event["involvedObject"]["uid"] == fp.uid
    assert "uses 9000 MiB" in event["message"] and "limit of 8000 MiB" in event["message"]
    wait_until(lambda: metric_value(world.metrics(), "gpufrac_violations_total", kind="memory-over-limit") == 1,
               what="the violation counted")
    world.set_process_memory(pid, 100)  # back within the limit: no more events later


def test_process_without_its_injected_limits_is_reported(world):
    fp = world.create_pod(unique("agent-bare"), gpu_uuid=GPU_UUIDS[0], limit_mib=4000)
    world.start_process(fp, used_mib=100, sm_util=1, env=WITHOUT_LIMITS)
    [event] = wait_until(lambda: world.events_for(fp.name), what="an event")
    assert event["reason"] == "GPULimitEnvMissing"
    assert "NVIDIA_GPU_MEMORY_LIMIT" in event["message"]


def test_modes_mixed_on_one_gpu_are_reported(world):
    # a time-slicing pod's process lands on GPU 1, which serves an sm-sharing pod
    served = world.create_pod(unique("agent-served"), gpu_uuid=GPU_UUIDS[1], limit_mib=4000, mode="sm-sharing")
    world.start_process(served, used_mib=100, sm_util=1)
    fp = world.create_pod(unique("agent-misplaced"), gpu_uuid=GPU_UUIDS[1], limit_mib=4000)
    world.start_process(fp, used_mib=100, sm_util=1)
    [event] = wait_until(lambda: world.events_for(fp.name), what="an event")
    assert event["reason"] == "GPUComputeModesMixed"
    assert "sm-sharing" in event["message"] and "time-slicing" in event["message"]


def test_killed_mps_daemon_is_restarted_and_counted(world):
    before = metric_value(world.metrics(), "gpufrac_mps_daemon_restarts_total", mode="sm-sharing")
    pid = world.daemon_pid("sm-sharing")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: world.daemon_pid("sm-sharing") != pid, what="a new daemon")
    text = wait_until(lambda: (t := world.metrics()) and metric_value(
        t, "gpufrac_mps_daemon_restarts_total", mode="sm-sharing") == before + 1 and metric_value(
        t, "gpufrac_mps_daemon_up", mode="sm-sharing") == 1 and t, what="restart counted, daemon up")
    assert metric_value(text, "gpufrac_mps_daemon_restarts_total", mode="time-slicing") == 0
    # the stale control socket the killed daemon left did not stop the new one
    assert not [r for r in world.daemon_records("sm-sharing") if r["event"] == "refused"]


def test_stopping_the_agent_quits_the_daemons_and_marks_the_node(world):
    fp = world.create_pod(unique("agent-restarted"), gpu_uuid=GPU_UUIDS[0], limit_mib=4000)
    world.start_process(fp, used_mib=100, sm_util=1, env=WITHOUT_LIMITS)  # one event, not repeated
    events_before = len(wait_until(lambda: world.events_for(fp.name), what="an event before the restart"))
    assert world.stop_agent() == 0
    for mode in ("time-slicing", "sm-sharing"):
        records = world.daemon_records(mode)
        assert {"event": "command", "command": "quit", "via": "stdin"}.items() <= records[-2].items()
        assert records[-1]["event"] == "exit" and records[-1]["code"] == 0
    cond = world.node_condition()
    assert (cond["status"], cond["reason"]) == ("Unknown", "AgentStopped")
    assert world.get_node()["metadata"]["labels"]["gpufrac.io/enforcement.sm-sharing"] == "none"
    # a restarted agent finds its earlier events and adds no duplicates
    world.start_agent()
    wait_until(lambda: (c := world.node_condition()) and c["status"] == "True", what="ready again")
    wait_until(lambda: metric_value(world.metrics(), "gpufrac_container_gpu_memory_used_bytes",
                                    pod=fp.name) is not None, what="a pass of the audit")
    assert len(world.events_for(fp.name)) == events_before
