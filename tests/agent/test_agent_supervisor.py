"""MPS daemon supervision, with the fake nvidia-cuda-mps-control as the child."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from e2e.toolkit.wait import wait_until
from gpufrac.agent.decide.model import DaemonState
from gpufrac.agent.decide.mps_config import daemon_spec, render_config
from gpufrac.agent.edges.supervisor import MpsSupervisor, RestartPolicy, initial_budget, next_restart, remove_stale
from gpufrac.core.annotations import ComputeMode

TS, SM = ComputeMode.TIME_SLICING, ComputeMode.SM_SHARING


def records(log_dir: Path) -> list[dict]:
    path = log_dir / "fake-mps-record.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def make(tmp_path: Path, mps_binary: str, *, mode=SM, v3=True, policy=None, quit_timeout=10.0, clock=None):
    spec = daemon_spec(mode, mps_v3=v3, binary=mps_binary, mps_root=tmp_path / "mps",
                       log_root=tmp_path / "log", config_dir=tmp_path / "config")
    kwargs = {"clock": clock} if clock else {}
    return MpsSupervisor(spec, policy or RestartPolicy(0.01, 0.08, 5, 300.0), quit_timeout=quit_timeout,
                         **kwargs)


# ---- the pure restart policy ----

def test_backoff_doubles_up_to_the_cap_then_the_budget_runs_out():
    policy = RestartPolicy(initial_backoff=5, max_backoff=60, max_restarts=6, stable_after=300)
    budget, delays = initial_budget(policy), []
    for _ in range(6):
        decision, budget = next_restart(policy, budget, uptime=1.0)
        assert decision.restart
        delays.append(decision.delay)
    assert delays == [5, 10, 20, 40, 60, 60]
    decision, _ = next_restart(policy, budget, uptime=1.0)
    assert not decision.restart


def test_budget_and_backoff_reset_after_stable_uptime():
    policy = RestartPolicy(initial_backoff=5, max_backoff=60, max_restarts=2, stable_after=300)
    budget = initial_budget(policy)
    _, budget = next_restart(policy, budget, 1.0)
    _, budget = next_restart(policy, budget, 1.0)
    assert not next_restart(policy, budget, 1.0)[0].restart  # a third quick crash: give up
    decision, budget = next_restart(policy, budget, 300.0)  # but it had stayed up 5 minutes
    assert (decision.restart, decision.delay, decision.attempt) == (True, 5, 1)


def test_zero_max_restarts_never_gives_up():
    policy = RestartPolicy(1, 2, 0, 300)
    budget = initial_budget(policy)
    for _ in range(50):
        decision, budget = next_restart(policy, budget, 0.0)
        assert decision.restart


# ---- config and stale files ----

def test_v3_daemon_invocation_and_config(tmp_path, mps_binary):
    sm = daemon_spec(SM, mps_v3=True, binary=mps_binary, mps_root=tmp_path / "mps", log_root=tmp_path / "log",
                     config_dir=tmp_path / "cfg")
    assert sm.argv == (mps_binary, "-p", "3", "-m", "-f", "-a", str(tmp_path / "cfg" / "sm-sharing.toml"))
    assert sm.env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "mps" / "sm-sharing")
    assert sm.env["CUDA_MPS_LOG_DIRECTORY"] == str(tmp_path / "log" / "sm-sharing")
    assert "[features.memacct]\nenabled = true" in sm.config_text
    assert "[features.context-share]\nenabled = true" in sm.config_text
    ts = daemon_spec(TS, mps_v3=True, binary=mps_binary, mps_root=tmp_path / "mps", log_root=tmp_path / "log",
                     config_dir=tmp_path / "cfg")
    assert "-m" not in ts.argv
    assert "[features.context-share]\nenabled = false" in ts.config_text
    assert "audit_log = true" in render_config(TS) and "audit_log = false" in render_config(SM, audit_log=False)
    legacy = daemon_spec(SM, mps_v3=False, binary=mps_binary, mps_root=tmp_path / "mps",
                         log_root=tmp_path / "log", config_dir=tmp_path / "cfg")
    assert legacy.argv == (mps_binary, "-f") and legacy.config_path is None


def test_remove_stale_keeps_other_files(tmp_path):
    import socket
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    (pipe / "control").write_text("")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(pipe / "mps_0"))
    s.close()
    (pipe / "keep.txt").write_text("x")
    removed = remove_stale(pipe)
    assert sorted(p.name for p in removed) == ["control", "mps_0"]
    assert [p.name for p in pipe.iterdir()] == ["keep.txt"]


# ---- the real supervisor with the fake daemon ----

def test_starts_over_a_stale_socket_and_quits_gracefully(tmp_path, mps_binary):
    sup = make(tmp_path, mps_binary)
    pipe = sup.spec.pipe_dir
    pipe.mkdir(parents=True)
    (pipe / "control").write_text("left by a crashed daemon")  # the fake refuses to start over it
    sup.start()
    wait_until(lambda: sup.status().up, what="daemon up")
    log_dir = sup.spec.log_dir
    start = records(log_dir)[0]
    assert start["argv"][1:] == ["-p", "3", "-m", "-f", "-a", str(sup.spec.config_path)]
    assert "[features.memacct]" in start["config"]
    assert start["pipe_dir"] == str(pipe)
    sup.stop()
    events = records(log_dir)
    assert {"command": "quit", "via": "stdin"}.items() <= events[-2].items()
    assert events[-1]["event"] == "exit" and events[-1]["code"] == 0
    assert not sup.killed
    status = sup.status()
    assert (status.state, status.up, status.restarts) == (DaemonState.STOPPED, False, 0)
    assert "Exiting control daemon" in (log_dir / "control.log").read_text()


def test_crash_loop_backs_off_then_gives_up_with_a_reason(tmp_path, mps_binary):
    sup = make(tmp_path, mps_binary, policy=RestartPolicy(0.01, 0.04, 4, 300.0))
    sup.spec.log_dir.mkdir(parents=True)
    (sup.spec.log_dir / "fake-crash").write_text("")
    sup.start()
    wait_until(lambda: sup.status().state is DaemonState.FAILED, what="budget exhausted")
    status = sup.status()
    assert sup.restart_delays == [0.01, 0.02, 0.04, 0.04]
    assert status.restarts == 4 and not status.up
    assert status.failure == ("exited with code 1 and was restarted 4 times in a row without staying up; "
                              "giving up")
    starts = [r for r in records(sup.spec.log_dir) if r["event"] == "start"]
    assert len(starts) == 5  # the first start and 4 restarts, none refused over a stale socket
    assert not [r for r in records(sup.spec.log_dir) if r["event"] == "refused"]
    sup.stop()
    assert sup.status().state is DaemonState.FAILED


def test_crash_is_restarted_and_comes_back_up(tmp_path, mps_binary):
    sup = make(tmp_path, mps_binary)
    sup.start()
    wait_until(lambda: sup.status().up, what="daemon up")
    first_pid = sup.pid
    (sup.spec.log_dir / "fake-crash").write_text("")
    wait_until(lambda: sup.status().restarts >= 1, what="a restart")
    (sup.spec.log_dir / "fake-crash").unlink()
    wait_until(lambda: sup.status().up and sup.pid != first_pid, what="daemon back up")
    sup.stop()


def test_budget_resets_after_stable_uptime(tmp_path, mps_binary):
    # Each daemon run "lasts" 1000 s on this clock, past stable_after: quick real crashes never use up the budget.
    ticks = iter(range(0, 10**9, 1000))
    lock = threading.Lock()

    def clock():
        with lock:
            return float(next(ticks))

    sup = make(tmp_path, mps_binary, policy=RestartPolicy(0.01, 0.08, 2, 500.0), clock=clock)
    sup.spec.log_dir.mkdir(parents=True)
    (sup.spec.log_dir / "fake-crash").write_text("")
    sup.start()
    wait_until(lambda: sup.status().restarts >= 5, what="five restarts")
    sup.stop()
    assert sup.status().state is DaemonState.STOPPED  # never FAILED, though max_restarts is 2
    assert set(sup.restart_delays) == {0.01}  # and the backoff started over every time


def test_quit_then_kill_when_the_daemon_ignores_quit(tmp_path, mps_binary):
    sup = make(tmp_path, mps_binary, quit_timeout=0.3)
    sup.spec.log_dir.mkdir(parents=True)
    (sup.spec.log_dir / "fake-ignore-quit").write_text("")
    sup.start()
    wait_until(lambda: sup.status().up, what="daemon up")
    pid = sup.pid
    sup.stop()
    assert sup.killed
    events = records(sup.spec.log_dir)
    assert any(e.get("command") == "quit" for e in events)
    assert not any(e["event"] == "exit" for e in events)  # it never exited by itself
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    assert sup.status().state is DaemonState.STOPPED


def test_missing_binary_counts_as_a_crash(tmp_path):
    sup = make(tmp_path, str(tmp_path / "no-such-binary"), policy=RestartPolicy(0.01, 0.01, 2, 300.0))
    sup.start()
    wait_until(lambda: sup.status().state is DaemonState.FAILED, what="failed")
    assert "could not be started" in sup.status().failure
    sup.stop()


@pytest.mark.parametrize("mode", [TS, SM])
def test_control_socket_answers_commands(tmp_path, mps_binary, mode):
    import subprocess
    sup = make(tmp_path, mps_binary, mode=mode)
    sup.start()
    wait_until(lambda: sup.status().up, what="daemon up")
    out = subprocess.run([mps_binary], input="get_server_list\n", env=sup.spec.env, capture_output=True,
                         text=True, timeout=10, check=True)
    assert out.returncode == 0
    assert any(r.get("command") == "get_server_list" and r["via"] == "socket" for r in records(sup.spec.log_dir))
    sup.stop()


def test_strays_of_this_pipe_dir_are_killed_before_a_start(tmp_path, mps_binary):
    import subprocess
    proc_root = tmp_path / "proc"
    sup = make(tmp_path, mps_binary)
    sup._proc_root = proc_root
    server, daemon, other = (subprocess.Popen(["sleep", "60"]) for _ in range(3))
    try:
        for child, argv, pipe in (
            (server, b"/usr/bin/nvidia-cuda-mps-server\0", sup.spec.pipe_dir),
            (daemon, b"python3\0/opt/nvidia-cuda-mps-control\0-f\0", sup.spec.pipe_dir),  # a killed agent's
            (other, b"/usr/bin/nvidia-cuda-mps-server\0", tmp_path / "someone-elses"),
        ):
            d = proc_root / str(child.pid)
            d.mkdir(parents=True)
            (d / "cmdline").write_bytes(argv)
            (d / "environ").write_bytes(f"CUDA_MPS_PIPE_DIRECTORY={pipe}\0".encode())
        (proc_root / "1").mkdir()  # something else, unreadable
        sup.start()
        wait_until(lambda: sup.status().up, what="daemon up")
        assert server.wait(10) == -9 and daemon.wait(10) == -9
        assert other.poll() is None
        sup.stop()
    finally:
        for child in (server, daemon, other):
            if child.poll() is None:
                child.kill()
            child.wait()
