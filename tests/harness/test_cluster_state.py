"""A cluster's recorded state (e2e/state.py) from another process: `stop_recorded` stops exactly the recorded
processes that still run, last started first, puts the machine back only after a real node, and forgets the file;
`owner` tells a live owner from a gone one; `private_workdir` clears the directories of gone owners; and
`python -m e2e` views a recorded cluster as the class of its kind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from e2e import __main__ as cli
from e2e import machine, state
from e2e.cluster import ControlPlane
from e2e.node import RealCluster
from e2e.toolkit.procs import Proc, proc_start_time, spawn


@pytest.fixture
def machine_cleanups(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, dict]]:
    """What would have put the machine back after a real node (never run for real here)."""
    calls: list[tuple[Path, dict]] = []
    monkeypatch.setattr(machine, "clean_orphan", lambda workdir, recorded: calls.append((workdir, recorded)))
    return calls


def sleeper(tmp_path: Path, name: str) -> Proc:
    return spawn(name, ["sleep", "60"], tmp_path / f"{name}.log")


def record(workdir: Path, kind: str, procs: dict[str, Proc], **extra: object) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    state.write(workdir, {"kind": kind, "components": list(procs), "procs": {n: p.to_json() for n, p in procs.items()},
                          "ports": {"apiserver": 6443, "webhook": 8443}, "tokens": {}, **extra})


def test_the_recorded_processes_that_run_are_stopped_and_the_state_forgotten(tmp_path, machine_cleanups):
    etcd, apiserver, webhook = (sleeper(tmp_path, n) for n in ("etcd", "kube-apiserver", "webhook"))
    apiserver.stop()  # already gone: not signalled, not listed
    record(tmp_path / "wd", ControlPlane.kind, {"etcd": etcd, "kube-apiserver": apiserver, "webhook": webhook})
    assert oct(os.stat(state.state_file(tmp_path / "wd")).st_mode & 0o777) == "0o600"  # it holds tokens

    assert state.stop_recorded(tmp_path / "wd") == ["webhook", "etcd"]  # last started first
    assert not etcd.alive() and not webhook.alive()
    assert not state.state_file(tmp_path / "wd").exists()
    assert machine_cleanups == []  # an API-only cluster changed nothing on the machine
    assert state.stop_recorded(tmp_path / "wd") == []  # nothing recorded any more


def test_a_real_node_also_puts_the_machine_back(tmp_path, machine_cleanups):
    kubelet = sleeper(tmp_path, "kubelet")
    record(tmp_path / "wd", state.REAL_NODE, {"kubelet": kubelet}, node_root="/nowhere", lock=None)
    assert state.stop_recorded(tmp_path / "wd") == ["kubelet"]
    [(workdir, recorded)] = machine_cleanups
    assert workdir == tmp_path / "wd" and recorded["node_root"] == "/nowhere"


def test_a_garbled_state_file_records_nothing(tmp_path, machine_cleanups):
    state.state_file(tmp_path).write_text("{not json")
    assert state.read(tmp_path) is None and state.owner(tmp_path) is None
    assert state.stop_recorded(tmp_path) == []


def test_the_owner_is_alive_only_with_its_pid_and_start_time(tmp_path):
    me = os.getpid()
    state.write(tmp_path, {"owner_pid": me, "owner_start_time": proc_start_time(me), "detach": False})
    assert state.owner(tmp_path) == (False, True)
    state.write(tmp_path, {"owner_pid": me, "owner_start_time": -1, "detach": True})  # a recycled pid
    assert state.owner(tmp_path) == (True, False)


def test_a_private_workdir_clears_what_gone_owners_left(tmp_path, machine_cleanups):
    gone = sleeper(tmp_path, "gone")
    gone.stop()
    left_running = sleeper(tmp_path, "etcd")
    orphan = tmp_path / f"pytest-{gone.pid}"
    record(orphan, ControlPlane.kind, {"etcd": left_running})
    alive_owner = tmp_path / f"pytest-{os.getppid()}"  # another live process's cluster stays
    alive_owner.mkdir()

    assert state.private_workdir("pytest", tmp_path) == tmp_path / f"pytest-{os.getpid()}"
    assert not orphan.exists() and not left_running.alive()
    assert alive_owner.is_dir()


def test_python_m_e2e_views_a_recorded_cluster_as_its_kind(tmp_path):
    record(tmp_path / "api", ControlPlane.kind, {})
    record(tmp_path / "node", state.REAL_NODE, {})
    record(tmp_path / "other", "unknown-kind", {})
    api, node = cli.load(tmp_path / "api"), cli.load(tmp_path / "node")
    assert type(api) is ControlPlane and api.ports["webhook"] == 8443 and api.detach
    assert type(node) is RealCluster
    assert cli.load(tmp_path / "other") is None and cli.load(tmp_path / "nothing") is None
    assert ControlPlane.load(tmp_path / "node") is None  # a class views only clusters of its kind
