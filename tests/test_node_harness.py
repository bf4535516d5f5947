"""The real node's harness hands the machine over safely: cleaning up after a node whose owner is gone must
never tear down the network, cgroups and mounts of another node that holds the machine's lock now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from e2e import node
from e2e.toolkit.procs import spawn


@pytest.fixture
def lock_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "real-node.lock"
    monkeypatch.setattr(node, "LOCK_FILE", str(path))
    return path


@pytest.fixture
def cleaned(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []
    monkeypatch.setattr(node, "clean_machine", lambda workdir, state, quiet=False: calls.append(workdir))
    return calls


def hold(lock_file: Path) -> subprocess.Popen[bytes]:
    """Another node: a process holding the machine's lock."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(lock_file)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)\n")],
        stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
    return holder


def test_an_orphan_on_a_free_machine_is_cleaned_under_the_lock(tmp_path, lock_file, monkeypatch):
    assert node.machine_is_free()
    free_while_cleaning: list[bool] = []
    monkeypatch.setattr(node, "clean_machine",
                        lambda workdir, state, quiet=False: free_while_cleaning.append(node.machine_is_free()))
    node.clean_orphan(tmp_path, {"lock": None})
    assert free_while_cleaning == [False]  # cleaned once, holding the machine's lock
    assert node.machine_is_free()  # and released afterwards


def test_an_orphan_leaves_the_machine_alone_while_another_node_holds_it(tmp_path, lock_file, cleaned, capsys):
    holder = hold(lock_file)
    try:
        assert not node.machine_is_free()
        node.clean_orphan(tmp_path, {"lock": None})
    finally:
        holder.kill()
        holder.wait()
    assert cleaned == []
    assert "another real node holds" in capsys.readouterr().out


def test_an_orphan_whose_own_lock_holder_still_runs_is_cleaned(tmp_path, lock_file, cleaned):
    # The orphan's `sleep infinity` lock child outlived its owner: the machine is still the orphan's.
    sleeper = spawn("node-lock", ["sleep", "60"], tmp_path / "node-lock.log")
    try:
        node.clean_orphan(tmp_path, {"lock": sleeper.to_json()})
    finally:
        sleeper.stop()
    assert cleaned == [tmp_path]
