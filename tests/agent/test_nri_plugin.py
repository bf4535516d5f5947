"""The NRI plugin's runner (gpufrac.agent.nri.plugin): registration, reconnecting at once, one instance per
node, and which GPU serves which mode, kept from Synchronize and the container events. Against the runtime stand-in."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufrac.agent.nri.config import NriConfig
from gpufrac.agent.nri.decide.creation import MARK, NodeFacts, Refusal, RefusalReason
from gpufrac.agent.nri.plugin import HEARTBEAT_S, PluginState
from gpufrac.agent.nri.stubs import api_pb2
from gpufrac.core.annotations import ComputeMode
from testkit.agent import UUID_A, UUID_B, canonical_annotations, cid, container, gpu_info, injected_env
from testkit.fakes.state import ProcRoot
from testkit.nri_plugin import RecordingSink, halt_plugin, start_plugin
from testkit.nri_runtime import FakeRuntime, nri_container, pod_sandbox

FACTS = NodeFacts((gpu_info(0, UUID_A), gpu_info(1, UUID_B)), frozenset({f"nvidia.com/gpu={UUID_B}"}), {},
                  dict.fromkeys(ComputeMode))



def wait_for(condition, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[FakeRuntime]:
    fake = FakeRuntime(tmp_path / "nri.sock")
    yield fake
    fake.close()




def fraction_pod(uid: str, mode: str) -> tuple[object, object]:
    annotations = canonical_annotations("app", request_mib=1024, limit_mib=2048, devices=[UUID_B], mode=mode)
    pod = pod_sandbox(f"pod-{uid}", uid, annotations)
    env = injected_env(container("app", mode=ComputeMode(mode), request_mib=1024, limit_mib=2048, devices=(UUID_B,)))
    return pod, env


def test_it_reconnects_at_once_and_resynchronizes(runtime: FakeRuntime, tmp_path: Path) -> None:
    sink = RecordingSink()
    config = NriConfig(runtime.path, lock_file=tmp_path / "lock", retry_interval=5.0)
    plugin, stop, thread = start_plugin(config, sink, FACTS)
    assert runtime.accept().plugin_name == "gpufrac"
    running_pod, env = fraction_pod("u-ts", "time-slicing")
    running = nri_container("c-ts", "app", running_pod, env, api_pb2.CONTAINER_RUNNING)
    runtime.handshake([running_pod], [running])
    assert wait_for(lambda: plugin.state is PluginState.REGISTERED)
    assert [s.container_id for s in plugin.serving()] == ["c-ts"]  # from Synchronize

    runtime.drop()  # containerd restarts
    started = time.monotonic()
    runtime.accept(timeout=2.0)  # the plugin is back well before the 5 s retry interval: at once
    assert time.monotonic() - started < 1.0
    runtime.handshake()  # the runtime now lists no containers: nothing serves
    assert wait_for(lambda: plugin.serving() == ())
    assert plugin.sessions >= 1
    halt_plugin(plugin, stop, thread)
    assert sink.states[-1] is PluginState.STOPPED


def test_a_gpu_serving_one_mode_refuses_the_other_until_it_is_gone(runtime: FakeRuntime, tmp_path: Path) -> None:
    sink = RecordingSink()
    plugin, stop, thread = start_plugin(NriConfig(runtime.path, lock_file=None), sink, FACTS)
    runtime.accept()
    runtime.handshake()
    ts_pod, ts_env = fraction_pod("u-ts", "time-slicing")
    sm_pod, sm_env = fraction_pod("u-sm", "sm-sharing")
    ts = nri_container("c-ts", "app", ts_pod, ts_env)
    assert runtime.create(ts_pod, ts).status.code == 0
    refused = runtime.create(sm_pod, nri_container("c-sm", "app", sm_pod, sm_env))
    assert refused.status.code == 9
    assert f"GPU {UUID_B} serves time-slicing to container app of pod team-a/pod-u-ts" in refused.status.message
    # a second time-slicing pod shares the GPU
    ts2_pod, ts2_env = fraction_pod("u-ts2", "time-slicing")
    assert runtime.create(ts2_pod, nri_container("c-ts2", "app", ts2_pod, ts2_env)).status.code == 0
    for gone in ("c-ts", "c-ts2"):
        runtime.call("StopContainer", api_pb2.StopContainerRequest(container=api_pb2.Container(id=gone)))
    assert runtime.create(sm_pod, nri_container("c-sm2", "app", sm_pod, sm_env)).status.code == 0
    outcomes = [(cid, r.reason if isinstance(r, Refusal) else r.outcome) for cid, r in sink.decisions]
    assert outcomes == [("c-ts", "injected"), ("c-sm", RefusalReason.MODE_CONFLICT), ("c-ts2", "injected"),
                        ("c-sm2", "injected")]
    halt_plugin(plugin, stop, thread)


def test_a_second_instance_waits_for_the_first(runtime: FakeRuntime, tmp_path: Path) -> None:
    config = NriConfig(runtime.path, lock_file=tmp_path / "nri" / "plugin.lock")
    first_sink, second_sink = RecordingSink(), RecordingSink()
    first = start_plugin(config, first_sink, FACTS)
    runtime.accept()
    runtime.handshake()
    second = start_plugin(config, second_sink, FACTS)
    assert wait_for(lambda: second[0].state is PluginState.WAITING_LOCK)
    halt_plugin(*first)  # the first one goes: the second one takes over and registers
    runtime.accept()
    runtime.handshake()
    assert wait_for(lambda: second[0].state is PluginState.REGISTERED)
    halt_plugin(*second)


def test_no_socket_is_reported_and_waited_for(tmp_path: Path) -> None:
    sink = RecordingSink()
    path = tmp_path / "nri.sock"
    plugin, stop, thread = start_plugin(NriConfig(path, lock_file=None, retry_interval=0.05), sink, FACTS)
    assert wait_for(lambda: plugin.state is PluginState.NO_SOCKET)
    runtime = FakeRuntime(path)  # NRI turned on: the plugin registers
    try:
        runtime.accept()
        runtime.handshake()
        assert wait_for(lambda: plugin.state is PluginState.REGISTERED)
    finally:
        halt_plugin(plugin, stop, thread)
        runtime.close()
    assert sink.states[:2] == [PluginState.NO_SOCKET, PluginState.CONNECTING]


# ---- back after being away: the fractions created meanwhile are stopped (the escape matrix's row 9) ----

@pytest.fixture
def processes(tmp_path: Path) -> Iterator[tuple[ProcRoot, list[subprocess.Popen[bytes]]]]:
    """A /proc the plugin reads (each entry's cgroup naming a container) over real processes it may kill."""
    children: list[subprocess.Popen[bytes]] = []
    yield ProcRoot(tmp_path / "proc"), children
    for child in children:
        child.kill()
        child.wait()


def first_process(processes: tuple[ProcRoot, list[subprocess.Popen[bytes]]], container_id: str) -> int:
    proc, children = processes
    child = subprocess.Popen(["sleep", "300"])
    children.append(child)
    proc.add(child.pid, container_id, {}, real=True)
    return child.pid


def test_back_after_a_disconnect_it_stops_the_fractions_created_without_it(runtime: FakeRuntime, tmp_path: Path,
                                                                           processes) -> None:
    sink = RecordingSink()
    config = NriConfig(runtime.path, lock_file=tmp_path / "lock", proc_root=processes[0].root)
    plugin, stop, thread = start_plugin(config, sink, FACTS)
    runtime.accept()
    served_pod, env = fraction_pod("u-served", "time-slicing")
    injected = runtime.create(served_pod, nri_container(cid(1), "app", served_pod, env))
    adjust = api_pb2.CreateContainerResponse.FromString(injected.payload).adjust
    assert adjust.annotations[MARK] == f"time-slicing nvidia.com/gpu={UUID_B}"  # what the plugin gave it
    runtime.handshake()
    assert wait_for(lambda: plugin.state is PluginState.REGISTERED)
    runtime.drop()  # away: containerd creates containers without the plugin
    away_pod, away_env = fraction_pod("u-away", "time-slicing")
    old_pod = fraction_pod("u-old", "time-slicing")[0]
    plain_pod = pod_sandbox("plain", "u-plain", {})
    pids = {n: first_process(processes, cid(n)) for n in (1, 2, 3, 4)}
    running = api_pb2.CONTAINER_RUNNING
    listed = [
        nri_container(cid(1), "app", served_pod, env, running, created_at=time.time(), pid=pids[1],
                      annotations=dict(adjust.annotations)),  # created through the plugin: its mark
        nri_container(cid(2), "app", away_pod, away_env, running, created_at=time.time(), pid=pids[2]),
        nri_container(cid(3), "app", plain_pod, {}, running, created_at=time.time(), pid=pids[3]),  # no fraction
        nri_container(cid(4), "app", old_pod, env, running, created_at=time.time() - 60, pid=pids[4]),  # before
    ]
    runtime.accept(timeout=2.0)
    runtime.handshake([served_pod, away_pod, plain_pod, old_pod], listed)
    children = dict(zip((1, 2, 3, 4), processes[1], strict=True))
    assert wait_for(lambda: children[2].poll() is not None), "the fraction created while away is stopped"
    assert children[2].returncode == -9
    assert all(children[n].poll() is None for n in (1, 3, 4))
    [found] = sink.unserved
    assert found.container.id == cid(2) and found.message.startswith(
        "container app of pod team-a/pod-u-away is a time-slicing GPU fraction created at ")
    assert "while the gpufrac NRI plugin was away" in found.message and "so the plugin stopped it" in found.message
    halt_plugin(plugin, stop, thread)


def test_a_fraction_created_while_away_and_not_started_is_refused_its_start(runtime: FakeRuntime,
                                                                           tmp_path: Path) -> None:
    """The sweep has no process to stop for a fraction created while the plugin was away but not yet started: its
    start is refused instead (the runtime fails it; the kubelet creates it again, through the plugin). A fraction
    the plugin served, and one created before the window, start."""
    lock = tmp_path / "lock"
    lock.write_text(f"4242\n{time.time() - 30:.3f}\n")  # the plugin before this one: last present 30 s ago
    sink = RecordingSink()
    plugin, stop, thread = start_plugin(NriConfig(runtime.path, lock_file=lock), sink, FACTS)
    runtime.accept()
    away_pod, env = fraction_pod("u-away", "sm-sharing")
    earlier_pod = fraction_pod("u-earlier", "sm-sharing")[0]
    created = api_pb2.CONTAINER_CREATED
    away = nri_container(cid(7), "app", away_pod, env, created, created_at=time.time() - 10)
    earlier = nri_container(cid(8), "app", earlier_pod, env, created, created_at=time.time() - 60)
    runtime.handshake([away_pod, earlier_pod], [away, earlier])
    assert wait_for(lambda: plugin.state is PluginState.REGISTERED)
    assert sink.unserved == []  # nothing to stop yet: neither has a process
    refused = runtime.start(away_pod, away)
    assert refused.status.code == 9 and refused.status.message.startswith(
        "container app of pod team-a/pod-u-away is a sm-sharing GPU fraction created at ")
    assert refused.status.message.endswith("so the plugin refused its start, and the kubelet creates it again "
                                           "through the plugin")
    assert [u.container.id for u in sink.unserved] == [cid(7)]
    assert runtime.start(earlier_pod, earlier).status.code == 0
    served_pod, served_env = fraction_pod("u-served", "sm-sharing")
    answer = runtime.create(served_pod, nri_container(cid(9), "app", served_pod, served_env))
    adjust = api_pb2.CreateContainerResponse.FromString(answer.payload).adjust
    served = nri_container(cid(9), "app", served_pod, served_env, created, created_at=time.time(),
                           annotations=dict(adjust.annotations))  # as the runtime starts it: with the mark
    assert runtime.start(served_pod, served).status.code == 0
    halt_plugin(plugin, stop, thread)


def test_a_restarted_plugin_knows_from_the_lock_file_since_when_it_was_away(runtime: FakeRuntime, tmp_path: Path,
                                                                             processes) -> None:
    lock = tmp_path / "lock"
    lock.write_text(f"4242\n{time.time() - 30:.3f}\n")  # the plugin before this one: last present 30 s ago
    sink = RecordingSink()
    plugin, stop, thread = start_plugin(NriConfig(runtime.path, lock_file=lock, proc_root=processes[0].root), sink,
                                        FACTS)
    runtime.accept()
    pod, env = fraction_pod("u-meanwhile", "sm-sharing")
    earlier_pod = fraction_pod("u-earlier", "sm-sharing")[0]
    reused = first_process(processes, cid(9))  # its PID now names another container: never killed
    runtime.handshake([pod, earlier_pod], [
        nri_container(cid(5), "app", pod, env, api_pb2.CONTAINER_RUNNING, created_at=time.time() - 10, pid=reused),
        nri_container(cid(6), "app", earlier_pod, env, api_pb2.CONTAINER_RUNNING, created_at=time.time() - 60)])
    assert wait_for(lambda: len(sink.unserved) == 1)
    assert sink.unserved[0].container.id == cid(5)
    assert f"it could not be stopped: process {reused} is no longer the container's" in sink.unserved[0].message
    assert processes[1][0].poll() is None
    # registered, it writes its own heartbeat for the plugin after it
    assert wait_for(lambda: len(lock.read_text().split()) == 2 and float(lock.read_text().split()[1]) > time.time() - 5,
                    timeout=HEARTBEAT_S * 3)
    halt_plugin(plugin, stop, thread)


def test_without_a_known_absence_nothing_is_stopped(runtime: FakeRuntime, tmp_path: Path, processes) -> None:
    sink = RecordingSink()  # a node where no plugin ran before: no lock file
    plugin, stop, thread = start_plugin(NriConfig(runtime.path, lock_file=tmp_path / "lock",
                                                  proc_root=processes[0].root), sink, FACTS)
    runtime.accept()
    pod, env = fraction_pod("u-any", "time-slicing")
    pid = first_process(processes, cid(7))
    runtime.handshake([pod], [nri_container(cid(7), "app", pod, env, api_pb2.CONTAINER_RUNNING,
                                            created_at=time.time(), pid=pid)])
    assert wait_for(lambda: plugin.state is PluginState.REGISTERED)
    time.sleep(0.2)
    assert sink.unserved == [] and processes[1][0].poll() is None
    halt_plugin(plugin, stop, thread)
