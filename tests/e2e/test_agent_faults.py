"""The node agent under faults, against the real control plane: `gpufrac agent` as its own process on the GPU
fakes (e2e/agent_world.py), while the tests crash its MPS daemon in a loop, kill and restart
kube-apiserver, SIGKILL the agent itself, and break the fake NVML's state file under it.

The API server is shared by the whole session: the test that stops it restarts it in a `finally`, and waits
until it is ready and its webhook configurations are active again."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from e2e.agent_world import GPU_UUIDS, AgentWorld, metric_value
from e2e.testing import unique
from e2e.toolkit.wait import wait_until
from testkit.fakes.build import MPS_CONTROL

pytestmark = pytest.mark.e2e

MIB = 2**20


@pytest.fixture
def new_world(cluster, tmp_path_factory, ns):
    worlds: list[AgentWorld] = []

    def make() -> AgentWorld:
        w = AgentWorld(cluster, tmp_path_factory.mktemp("agent-faults"), namespace=ns)
        worlds.append(w)
        return w

    yield make
    for w in worlds:
        try:
            w.stop_agent()
        finally:
            w.delete_pods(*w.created)


def condition_is(w: AgentWorld, status: str, reason: str):
    cond = w.node_condition()
    return cond if cond and (cond["status"], cond["reason"]) == (status, reason) else None


def labels(w: AgentWorld) -> dict[str, str]:
    return w.get_node()["metadata"].get("labels", {})


def used(w: AgentWorld, pod: str, gpu: str | None = None) -> float | None:
    extra = {"UUID": gpu} if gpu else {}
    return metric_value(w.metrics(), "gpufrac_container_gpu_memory_used_bytes", pod=pod, **extra)


def assert_agent_up(w: AgentWorld) -> None:
    assert w.agent is not None and w.agent.alive(), w.agent_log()
    assert w.healthz() == (200, "ok\n")
    assert "gpufrac_nvml_up" in w.metrics()


# ---- an MPS daemon that crashes at once, every time ----


def test_mps_daemon_crash_loop_gives_up_and_the_agent_stays_up(new_world):
    w = new_world()
    flag = w.log_root / "sm-sharing" / "fake-crash"
    flag.parent.mkdir(parents=True)
    flag.write_text("")
    w.start_agent("--max-restarts", "3")
    cond = wait_until(lambda: condition_is(w, "False", "MpsDaemonFailed"), 60, "MpsDaemonFailed")
    assert "sm-sharing MPS control daemon exited with code 1" in cond["message"]
    assert "restarted 3 times in a row" in cond["message"] and "giving up" in cond["message"]
    assert "control.log" in cond["message"] and "restart the gpufrac agent pod" in cond["message"]
    node_labels = wait_until(lambda: (ls := labels(w)).get("gpufrac.io/enforcement.sm-sharing") == "none" and ls,
                             what="sm-sharing label none")
    assert node_labels["gpufrac.io/enforcement.time-slicing"] == "driver"
    text = wait_until(lambda: (t := w.metrics()) and metric_value(
        t, "gpufrac_mps_daemon_restarts_total", mode="sm-sharing") == 3 and t, what="3 restarts counted")
    assert metric_value(text, "gpufrac_mps_daemon_up", mode="sm-sharing") == 0
    assert metric_value(text, "gpufrac_mps_daemon_up", mode="time-slicing") == 1
    assert metric_value(text, "gpufrac_node_enforcement", mode="sm-sharing", enforcement="none") == 1
    starts = [r for r in w.daemon_records("sm-sharing") if r["event"] == "start"]
    assert len(starts) == 4  # the first start and 3 restarts
    # it gave up: no more starts however long it runs (backoff 0.2 s doubling: 3 s is several more rounds)
    time.sleep(3)
    assert len([r for r in w.daemon_records("sm-sharing") if r["event"] == "start"]) == 4
    assert_agent_up(w)
    code, text = w.readyz()
    assert code == 503 and "sm-sharing MPS daemon failed" in text
    assert w.stop_agent() == 0
    assert condition_is(w, "Unknown", "AgentStopped")


# ---- kube-apiserver down, then back ----


def test_apiserver_down_and_back(new_world, cluster):
    w = new_world()
    w.start_agent()
    ok = w.create_pod(unique("flt-ok"), gpu_uuid=GPU_UUIDS[0], limit_mib=8000)
    bad = w.create_pod(unique("flt-bad"), gpu_uuid=GPU_UUIDS[0], limit_mib=4000)
    pid_ok = w.start_process(ok, used_mib=1000, sm_util=5)
    w.start_process(bad, used_mib=5000, sm_util=5)
    [event] = wait_until(lambda: w.events_for(bad.name), what="the violation's event")
    assert event["reason"] == "GPUMemoryLimitExceeded"
    wait_until(lambda: used(w, ok.name) == 1000 * MIB, what="the ok pod in metrics")
    wait_until(lambda: condition_is(w, "True", "FractionsEnforced"), what="ready")
    reconnects = metric_value(w.metrics(), "gpufrac_watch_reconnects_total")

    t0 = time.monotonic()
    cluster.stop_apiserver()
    try:
        # the node's state changes while it cannot be published (GPU 1 is gone), and the audit goes on
        w.gpus.state["gpus"] = [g for g in w.gpus.state["gpus"] if g["uuid"] == GPU_UUIDS[0]]
        w.gpus.write()
        w.set_process_memory(pid_ok, 2000)
        wait_until(lambda: used(w, ok.name) == 2000 * MIB, 30, "metrics following NVML during the outage")
        wait_until(lambda: "pod watch" in w.agent_log(), 30, "the watch to notice the outage")
        wait_until(lambda: "publishing node state" in w.agent_log(), 30, "a failed publish, logged")
        time.sleep(2)  # a few more loops with the API server down
        assert_agent_up(w)
        down_s = time.monotonic() - t0
    finally:
        cluster.start_apiserver()
    back_s = time.monotonic() - t0 - down_s

    # a pod created and bound right after the restart is picked up by the resumed watch
    new = w.create_pod(unique("flt-new"), gpu_uuid=GPU_UUIDS[0], limit_mib=6000)
    w.start_process(new, used_mib=700, sm_util=3)
    wait_until(lambda: used(w, new.name) == 700 * MIB, 60, "the new pod in metrics")
    text = w.metrics()
    assert metric_value(text, "gpufrac_watch_reconnects_total") > reconnects
    # no pod missed
    assert metric_value(text, "gpufrac_container_gpu_memory_used_bytes", pod=ok.name) == 2000 * MIB
    assert metric_value(text, "gpufrac_container_gpu_memory_used_bytes", pod=bad.name) == 5000 * MIB
    # what changed during the outage is published now
    wait_until(lambda: labels(w).get("gpufrac.io/gpu-count") == "1", 30, "gpu-count published after the outage")
    # a deletion after the restart reaches the cache too
    w.delete_pods(ok.name)
    wait_until(lambda: used(w, ok.name) is None, 30, "the deleted pod gone from metrics")
    # no duplicate events
    assert len(w.events_for(bad.name)) == 1
    assert w.events_for(new.name) == []
    assert metric_value(w.metrics(), "gpufrac_violations_total", kind="memory-over-limit") == 1
    assert_agent_up(w)
    print(f"\n[faults] apiserver down {down_s:.1f} s, back and ready (webhook active) in {back_s:.1f} s")


# ---- the agent SIGKILLed and started again ----


def test_agent_killed_and_restarted(new_world, cluster):
    w = new_world()
    w.start_agent()
    ok = w.create_pod(unique("rst-ok"), gpu_uuid=GPU_UUIDS[0], limit_mib=8000)
    bad = w.create_pod(unique("rst-bad"), gpu_uuid=GPU_UUIDS[1], limit_mib=4000, mode="sm-sharing")
    w.start_process(ok, used_mib=1000, sm_util=5)
    w.start_process(bad, used_mib=5000, sm_util=5)
    wait_until(lambda: w.events_for(bad.name), what="the violation's event")
    wait_until(lambda: condition_is(w, "True", "FractionsEnforced"), what="ready")
    events_before = {name: len(w.events_for(name)) for name in (ok.name, bad.name)}
    assert events_before == {ok.name: 0, bad.name: 1}
    for mode in ("time-slicing", "sm-sharing"):
        assert len(w.live_daemons(mode)) == 1

    w.kill_agent()
    # its daemons lose their stdin; the fake exits then (a real one may linger, see below)
    for mode in ("time-slicing", "sm-sharing"):
        wait_until(lambda m=mode: not w.live_daemons(m), 30, f"the killed agent's {mode} daemon to exit")
    # a daemon the killed agent left running on the sm-sharing pipe directory, holding its control socket
    pipe, logs = w.mps_root / "sm-sharing", w.log_root / "sm-sharing"
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    stray = subprocess.Popen([str(MPS_CONTROL), "-f"], env=env, stdin=subprocess.PIPE, start_new_session=True)
    try:
        wait_until(lambda: (pipe / "control").is_socket(), 30, "the stray daemon's socket")
        w.expose_process(stray.pid)
        # nothing the killed agent published is trusted: wipe the node's labels and condition
        w._kubectl("admin", "label", "node", w.node, "gpufrac.io/gpu-count-", "gpufrac.io/driver-version.major-",
                   "gpufrac.io/enforcement.time-slicing-", "gpufrac.io/enforcement.sm-sharing-")
        wiped = {"status": {"conditions": [{"type": "gpufrac.io/Ready", "status": "Unknown", "reason": "Wiped",
                                            "message": "wiped by the test"}]}}
        w._kubectl("admin", "patch", "node", w.node, "--subresource=status", "--type=strategic", "-p",
                   json.dumps(wiped))
        assert condition_is(w, "Unknown", "Wiped")

        w.start_agent()
        assert stray.wait(30) == -9  # killed before the new daemon started
    finally:
        if stray.poll() is None:
            stray.kill()
            stray.wait()
    wait_until(lambda: condition_is(w, "True", "FractionsEnforced"), 60, "the condition rebuilt")
    node_labels = labels(w)
    assert node_labels["gpufrac.io/gpu-count"] == "2"
    assert node_labels["gpufrac.io/driver-version.major"] == "615"
    assert node_labels["gpufrac.io/enforcement.time-slicing"] == "driver"
    assert node_labels["gpufrac.io/enforcement.sm-sharing"] == "driver"
    for mode in ("time-slicing", "sm-sharing"):
        live = w.live_daemons(mode)
        assert len(live) == 1, f"{mode}: {live}"  # one daemon per pipe directory
        assert (w.mps_root / mode / "control").is_socket()
        assert not [r for r in w.daemon_records(mode) if r["event"] == "refused"]
    wait_until(lambda: used(w, ok.name) == 1000 * MIB and used(w, bad.name) == 5000 * MIB, 30,
               "the existing pods back in metrics")
    text = w.metrics()
    assert metric_value(text, "gpufrac_mps_daemon_up", mode="sm-sharing") == 1
    # the earlier event is found by its name: not repeated, not counted again
    assert {name: len(w.events_for(name)) for name in (ok.name, bad.name)} == events_before
    assert metric_value(text, "gpufrac_violations_total", kind="memory-over-limit") == 0
    assert_agent_up(w)


# ---- NVML errors, a GPU that disappears, a corrupt or missing state file ----


def test_nvml_faults_while_running(new_world):
    w = new_world()
    w.start_agent()
    fp = w.create_pod(unique("nvml-a"), gpu_uuid=GPU_UUIDS[0], limit_mib=8000)
    fq = w.create_pod(unique("nvml-b"), gpu_uuid=GPU_UUIDS[1], limit_mib=8000)
    w.start_process(fp, used_mib=1000, sm_util=5)
    w.start_process(fq, used_mib=1500, sm_util=5)
    wait_until(lambda: used(w, fp.name) == 1000 * MIB and used(w, fq.name) == 1500 * MIB, what="metrics")
    wait_until(lambda: condition_is(w, "True", "FractionsEnforced"), what="ready")
    pid = w.agent.pid
    good = w.gpus.path.read_text()

    def nvml_down(text: str) -> None:
        cond = wait_until(lambda: (c := condition_is(w, "False", "NvmlUnavailable")) and text in c["message"] and c,
                          30, f"NvmlUnavailable ({text})")
        assert "check that the NVIDIA driver is loaded" in cond["message"]
        metrics = wait_until(lambda: (t := w.metrics()) and metric_value(t, "gpufrac_nvml_up") == 0 and t,
                             what="nvml_up 0")
        assert metric_value(metrics, "gpufrac_container_gpu_memory_used_bytes", pod=fp.name) is None
        node_labels = labels(w)
        assert node_labels["gpufrac.io/enforcement.time-slicing"] == "none"
        assert node_labels["gpufrac.io/enforcement.sm-sharing"] == "none"
        code, body = w.readyz()
        assert code == 503 and "NVML unavailable" in body
        time.sleep(1.5)  # several loops in that state
        assert_agent_up(w)
        assert w.agent.pid == pid

    def recovered(gpus: int = 2) -> None:
        wait_until(lambda: condition_is(w, "True", "FractionsEnforced"), 30, "recovered")
        wait_until(lambda: labels(w).get("gpufrac.io/gpu-count") == str(gpus), 30, f"gpu-count {gpus}")
        wait_until(lambda: metric_value(w.metrics(), "gpufrac_nvml_up") == 1, what="nvml_up 1")
        wait_until(lambda: used(w, fp.name) == 1000 * MIB, 30, "usage back")

    # an NVML error on every call (15: GPU is lost)
    w.gpus.set(error=15)
    nvml_down("GPU is lost")
    w.gpus.state.pop("error")
    w.gpus.write()
    recovered()

    # GPU 1 disappears: the label follows, its series go
    w.gpus.state["gpus"] = [g for g in w.gpus.state["gpus"] if g["uuid"] == GPU_UUIDS[0]]
    w.gpus.write()
    wait_until(lambda: labels(w).get("gpufrac.io/gpu-count") == "1", 30, "gpu-count 1")
    wait_until(lambda: GPU_UUIDS[1] not in w.metrics(), 30, "GPU 1's series gone")
    assert used(w, fp.name, GPU_UUIDS[0]) == 1000 * MIB
    assert "on 1 GPU(s)" in condition_is(w, "True", "FractionsEnforced")["message"]
    w.gpus.path.write_text(good)
    recovered()
    wait_until(lambda: used(w, fq.name, GPU_UUIDS[1]) == 1500 * MIB, 30, "GPU 1's series back")

    # a corrupt state file, then a missing one
    w.gpus.path.write_text('{"driver_version": "615.20", "gpus": [')
    nvml_down("Unknown Error")
    w.gpus.path.unlink()
    nvml_down("Driver Not Loaded")
    w.gpus.path.write_text(good)
    recovered()
    assert w.agent.pid == pid
    assert "Traceback" not in w.agent_log()


def test_agent_starting_without_the_nvml_state_stays_up(new_world):
    w = new_world()
    w.gpus.path.unlink()
    w.start_agent()
    cond = wait_until(lambda: condition_is(w, "False", "NvmlUnavailable"), 30, "NvmlUnavailable")
    assert "Driver Not Loaded" in cond["message"]
    time.sleep(1.5)
    assert_agent_up(w)
    assert not w.daemon_records("sm-sharing")  # nothing is served without an inventory
    w.gpus.write()
    wait_until(lambda: condition_is(w, "True", "FractionsEnforced"), 30, "ready once NVML answers")
    assert labels(w)["gpufrac.io/gpu-count"] == "2"
