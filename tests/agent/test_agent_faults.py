"""The agent's loop under faults, in one process: the real `Agent.run` loop in a thread, real pynvml over the fake
libnvidia-ml.so.1 (whose JSON state the tests break and mend while the loop runs), the fake MPS daemon, a fake
/proc, the HTTP endpoints, and an in-memory Kubernetes API (or the real client pointed at a closed port)."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.toolkit.wait import wait_until
from gpufrac.agent.decide.model import DaemonState
from gpufrac.agent.edges.kube import KubeClient
from gpufrac.agent.edges.supervisor import RestartPolicy
from gpufrac.agent.node.node_loop import Agent
from gpufrac.agent.programs.node_agent import probe_server
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import MIB
from testkit.agent import UUID_A, UUID_B, FakeKube, FakeNode, cid, env_for, scrape, value


def http(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


class Running:
    """An agent running its real loop in a thread, with its HTTP server."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.server = probe_server("127.0.0.1:0", agent.metrics, agent)
        self.server.start()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.agent.run(self.stop)
        except BaseException as err:  # the loop must never die
            self.errors.append(err)

    @property
    def port(self) -> int:
        return self.server.port

    def ticks_advance(self) -> None:
        """The loop completes whole iterations (not merely survives them)."""
        first = wait_until(lambda: self.agent._last_tick, what="a first tick")
        wait_until(lambda: self.agent._last_tick and self.agent._last_tick > first, what="another whole tick")

    def assert_alive(self) -> None:
        assert self.thread.is_alive() and not self.errors
        assert http(self.port, "/healthz") == (200, "ok\n")
        code, body = http(self.port, "/metrics")
        assert code == 200 and "gpufrac_nvml_up" in body

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)
        self.server.stop()


def condition(kube: FakeKube) -> dict:
    return kube.last_condition()


@pytest.fixture
def world(fake_node: FakeNode) -> FakeNode:
    """Each pod's container has a process on its GPU; the daemons restart fast and give up after 3 crashes."""
    fake_node.config = replace(fake_node.config, restart_policy=RestartPolicy(0.05, 0.2, 3, 300.0))
    fake_node.proc.add(4242, cid(1), env_for("time-slicing", 20000, 20000, UUID_A))
    fake_node.proc.add(5151, cid(2), env_for("sm-sharing", 16000, 10000, UUID_B))
    fake_node.gpus.processes(UUID_A, [{"pid": 4242, "used_memory_mib": 2048, "sm_util": 10}])
    fake_node.gpus.processes(UUID_B, [{"pid": 5151, "used_memory_mib": 4096, "sm_util": 12}])
    return fake_node


@pytest.fixture
def start(world: FakeNode) -> Iterator[Callable[..., Running]]:
    """Start an agent's real loop on the node (its API `kube_sink`, default the node's); closed after the test."""
    running: list[Running] = []

    def start(kube_sink: Any = None, **changes: Any) -> Running:
        r = Running(world.agent(kube_sink, **changes))
        running.append(r)
        return r

    yield start
    for r in running:
        r.close()


def records(log_dir: Path) -> list[dict]:
    path = log_dir / "fake-mps-record.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# ---- the MPS daemon crashes at once, again and again ----


def test_daemon_crash_loop_exhausts_its_budget_and_the_agent_keeps_serving(world, start):
    log_dir = world.tmp / "log" / "sm-sharing"
    log_dir.mkdir(parents=True)
    (log_dir / "fake-crash").write_text("")  # every start of the sm-sharing daemon exits 1 at once
    r = start()
    agent = r.agent

    def failed():
        c = condition(world.kube)
        return c.get("reason") == "MpsDaemonFailed" and c

    cond = wait_until(failed, what="MpsDaemonFailed")
    assert cond["status"] == "False"
    assert "sm-sharing MPS control daemon exited with code 1" in cond["message"]
    assert "restarted 3 times in a row" in cond["message"]
    assert "control.log" in cond["message"] and "restart the gpufrac agent pod" in cond["message"]
    sup = agent.supervisors[ComputeMode.SM_SHARING]
    assert sup.restart_delays == [0.05, 0.1, 0.2]  # backoff doubled, capped
    starts = [x for x in records(log_dir) if x["event"] == "start"]
    assert len(starts) == 4  # the first start and 3 restarts
    wait_until(lambda: world.kube.labels.get("gpufrac.io/enforcement.sm-sharing") == "none", what="label none")
    assert world.kube.labels["gpufrac.io/enforcement.time-slicing"] == "driver"
    r.ticks_advance()
    m = agent.metrics
    assert value(m, "gpufrac_mps_daemon_up", mode="sm-sharing") == 0
    assert value(m, "gpufrac_mps_daemon_restarts_total", mode="sm-sharing") == 3
    assert value(m, "gpufrac_mps_daemon_up", mode="time-slicing") == 1
    assert value(m, "gpufrac_node_enforcement", mode="sm-sharing", enforcement="none") == 1
    # it gave up: no further starts however long the loop runs (10x the largest backoff)
    time.sleep(2.0)
    assert len([x for x in records(log_dir) if x["event"] == "start"]) == 4
    assert sup.status().state is DaemonState.FAILED
    r.assert_alive()
    code, text = http(r.port, "/readyz")
    assert code == 503 and "sm-sharing MPS daemon failed" in text
    # the pods are still audited
    assert value(m, "gpufrac_container_gpu_memory_used_bytes", namespace="team-a", pod="train", container="app",
                 UUID=UUID_A, Hostname="gpu-node-1") == 2048 * MIB


# ---- the API server cannot be reached ----


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


class ApiServerDown(FakeKube):
    """Pods from memory, but node patches and Events through the real client, to an API server that is down."""

    def __init__(self, base: FakeKube) -> None:
        super().__init__(base.pods)
        configuration = client.Configuration()
        configuration.host = f"http://127.0.0.1:{closed_port()}"
        configuration.retries = 0
        self.real = KubeClient(client.ApiClient(configuration))
        self.patch_node_labels = self.real.patch_node_labels
        self.patch_node_condition = self.real.patch_node_condition
        self.create_event = self.real.create_event


def test_unreachable_api_server_does_not_stop_the_loop(world, start):
    world.proc.add(4343, cid(1), env_for("time-slicing", 20000, 20000, UUID_A))
    kube = ApiServerDown(world.kube)
    r = start(kube)
    # whole iterations complete: publishing fails, the audit and the metrics go on
    r.ticks_advance()
    r.ticks_advance()
    r.assert_alive()
    labels = {"namespace": "team-a", "pod": "train", "container": "app", "UUID": UUID_A, "Hostname": "gpu-node-1"}
    wait_until(lambda: value(r.agent.metrics, "gpufrac_container_gpu_memory_used_bytes", **labels) == 2048 * MIB,
             what="usage while the API server is down")
    world.gpus.processes(UUID_A, [{"pid": 4242, "used_memory_mib": 2048, "sm_util": 10},
                                  {"pid": 4343, "used_memory_mib": 1000, "sm_util": 5}])
    wait_until(lambda: value(r.agent.metrics, "gpufrac_container_gpu_memory_used_bytes", **labels) == 3048 * MIB,
             what="usage following NVML while the API server is down")
    # a violation whose Event cannot be created now is neither lost nor counted twice
    world.gpus.processes(UUID_A, [{"pid": 4242, "used_memory_mib": 25000, "sm_util": 10}])
    wait_until(lambda: r.agent.violations, what="the violation seen")
    r.ticks_advance()
    assert value(r.agent.metrics, "gpufrac_violations_total", kind="memory-over-limit") == 0
    ok, _ = r.agent.healthz()
    assert ok
    # the API server is back: one Event, counted once; the node state published
    for name in ("patch_node_labels", "patch_node_condition", "create_event"):
        delattr(kube, name)
    wait_until(lambda: kube.events, what="the Event once the API server is back")
    wait_until(lambda: kube.labels.get("gpufrac.io/gpu-count") == "2" and kube.conditions, what="node published")
    r.ticks_advance()
    r.ticks_advance()
    [event] = kube.events.values()
    assert event["reason"] == "GPUMemoryLimitExceeded"
    assert kube.create_event_calls == 1
    assert value(r.agent.metrics, "gpufrac_violations_total", kind="memory-over-limit") == 1


# ---- NVML errors, a GPU that disappears, a broken state file ----


def test_nvml_error_and_a_lost_gpu_while_running(world, start):
    r = start()
    m = r.agent.metrics
    train = {"namespace": "team-a", "pod": "train", "container": "app", "UUID": UUID_A, "Hostname": "gpu-node-1"}
    infer = {"namespace": "team-a", "pod": "infer", "container": "worker", "UUID": UUID_B, "Hostname": "gpu-node-1"}
    wait_until(lambda: condition(world.kube).get("reason") == "FractionsEnforced", what="ready")
    wait_until(lambda: value(m, "gpufrac_container_gpu_memory_used_bytes", **infer) == 4096 * MIB, what="usage")
    assert world.kube.labels["gpufrac.io/gpu-count"] == "2"

    # NVML fails on every call: GPU is lost (15)
    world.gpus.set(error=15)
    cond = wait_until(lambda: (c := condition(world.kube)).get("reason") == "NvmlUnavailable" and c, what="NVML down")
    assert cond["status"] == "False" and "GPU is lost" in cond["message"]
    assert "check that the NVIDIA driver is loaded" in cond["message"]
    wait_until(lambda: value(m, "gpufrac_nvml_up") == 0, what="nvml_up 0")
    assert world.kube.labels["gpufrac.io/enforcement.sm-sharing"] == "none"
    assert world.kube.labels["gpufrac.io/enforcement.time-slicing"] == "none"
    # no stale per-fraction series while NVML cannot be read
    wait_until(lambda: value(m, "gpufrac_container_gpu_memory_used_bytes", **infer) is None, what="series dropped")
    r.ticks_advance()
    r.assert_alive()
    code, text = http(r.port, "/readyz")
    assert code == 503 and "NVML unavailable" in text

    # back, but GPU B is gone
    world.gpus.state.pop("error")
    world.gpus.state["gpus"] = [g for g in world.gpus.state["gpus"] if g["uuid"] == UUID_A]
    world.gpus.write()
    wait_until(lambda: world.kube.labels.get("gpufrac.io/gpu-count") == "1", what="gpu-count 1")
    wait_until(lambda: condition(world.kube).get("reason") == "FractionsEnforced", what="ready on one GPU")
    assert "on 1 GPU(s)" in condition(world.kube)["message"]
    assert value(m, "gpufrac_nvml_up") == 1
    wait_until(lambda: value(m, "gpufrac_container_gpu_memory_used_bytes", **train) == 2048 * MIB, what="GPU A")
    r.ticks_advance()
    assert not [k for k in scrape(m) if dict(k[1]).get("UUID") == UUID_B]

    # GPU B back
    world.gpus.gpu(UUID_B, memory_total_mib=80000, processes=[{"pid": 5151, "used_memory_mib": 4096, "sm_util": 12}])
    wait_until(lambda: world.kube.labels.get("gpufrac.io/gpu-count") == "2", what="gpu-count 2")
    wait_until(lambda: value(m, "gpufrac_container_gpu_memory_used_bytes", **infer) == 4096 * MIB, what="GPU B back")
    assert condition(world.kube)["reason"] == "FractionsEnforced"
    assert world.kube.labels["gpufrac.io/enforcement.sm-sharing"] == "driver"
    r.assert_alive()


@pytest.mark.parametrize(("breakage", "text"), [
    ("missing", "Driver Not Loaded"),
    ("corrupt", "Unknown Error"),
    ("truncated", "Unknown Error"),
])
def test_broken_state_file_is_a_clear_condition_not_a_crash(world, start, breakage, text):
    good = world.gpus.path.read_text()
    if breakage == "missing":
        world.gpus.path.unlink()
    else:
        world.gpus.path.write_text("{not json" if breakage == "corrupt" else good[: len(good) // 2])
    r = start()
    cond = wait_until(lambda: (c := condition(world.kube)).get("reason") == "NvmlUnavailable" and c,
                    what="NvmlUnavailable")
    assert cond["status"] == "False" and text in cond["message"]
    r.ticks_advance()
    r.ticks_advance()
    r.assert_alive()
    assert value(r.agent.metrics, "gpufrac_nvml_up") == 0
    assert r.agent.supervisors == {}  # nothing to serve without an inventory
    # mended: the agent recovers by itself
    world.gpus.path.write_text(good)
    wait_until(lambda: condition(world.kube).get("reason") == "FractionsEnforced", what="recovered")
    assert value(r.agent.metrics, "gpufrac_nvml_up") == 1
    assert world.kube.labels["gpufrac.io/gpu-count"] == "2"
