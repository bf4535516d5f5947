"""Rows 9a, 9b and 9c (gpucheck/checks/escapes.py) against the fakes: the fake MPS daemon told a pinned limit, the fake
libcuda.so.1 holding its clients to the lower of the daemon's and their env's, and dropping an index-keyed env that
names a GPU the client cannot see, as NVIDIA measured on r615."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpucheck.rows import FAIL, PASS
from testkit.fakes.build import MPS_CONTROL, fake_cuda_library, fake_nvml_library

ROOT = Path(__file__).resolve().parents[2]
FAKE_NODE = ROOT / "testkit" / "fakes" / "gpu_check_node.json"


@pytest.fixture(autouse=True)
def short_workdir(tmp_path: Path) -> Iterator[None]:
    """The check's work directory at a short path, seen as tmp_path/work: row 9c's namespace socket,
    `<work>/mps/sm-sharing/gpufrac/<namespace>/control`, must fit a unix socket's 107 bytes."""
    short = Path(tempfile.mkdtemp(prefix="gc", dir="/tmp"))
    (tmp_path / "work").symlink_to(short)
    yield
    shutil.rmtree(short, ignore_errors=True)


def run_rows(tmp_path: Path, env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    (tmp_path / "processes").mkdir()
    full_env = {**os.environ, "GPUFRAC_FAKE_NVML": str(FAKE_NODE),
           "GPUFRAC_FAKE_NVML_SETTINGS": str(tmp_path), "GPUFRAC_FAKE_GPU_PROCESSES": str(tmp_path /
                "processes"), "GPUFRAC_FAKE_CUDA_LOCK": str(tmp_path / "gpu.lock"), "GPUFRAC_FAKE_CUDA_RATE": "2e8",
                **(env or {})}
    result = subprocess.run([sys.executable, str(ROOT / "gpucheck" / "__main__.py"), "--only", "9",
                             "--spin-seconds", "0.5", "--nvml", str(fake_nvml_library()), "--mps-control",
                             str(MPS_CONTROL), "--cuda", str(fake_cuda_library()), "--workdir",
                             str((tmp_path / "work").resolve()), "--out", str(tmp_path / "report.json")],
                            capture_output=True, text=True, env=full_env, timeout=240, check=False)
    assert (tmp_path / "report.json").is_file(), result.stdout[-3000:] + result.stderr[-3000:]
    return {c["id"]: c for c in json.loads((tmp_path / "report.json").read_text())["checks"]}


def told(tmp_path: Path) -> list[str]:
    path = tmp_path / "work" / "log" / "sm-sharing" / "fake-mps-record.jsonl"
    return [e["command"] for e in map(json.loads, path.read_text().splitlines()) if e.get("event") == "limit"]


def test_the_daemon_side_holds_a_client_without_env(tmp_path: Path) -> None:
    """(A client whose env names a GPU it cannot see is not held by the daemon side: NVIDIA's measurement, which
    the fakes follow; tests/agent/test_nvidia_fakes.py.)"""
    rows = run_rows(tmp_path)
    assert rows["9a"]["status"] == PASS, rows["9a"]
    assert rows["9b"]["status"] == PASS, rows["9b"]
    held = [c["probe"]["allocated_mib"] for c in rows["9a"]["numbers"]["clients"]]
    limit = rows["9a"]["numbers"]["clients"][0]["limit_mib"]
    assert len(held) == 1 and all(limit // 2 <= mib <= limit for mib in held), (held, limit)
    lower, higher = (c["probe"]["allocated_mib"] for c in rows["9b"]["numbers"]["clients"])
    assert lower <= limit < higher <= 2 * limit  # the UUID key lowered one; the other asked 4A and got the daemon's 2A
    assert any(c.startswith("set_default_device_pinned_mem_limit GPU-") for c in told(tmp_path))


def test_a_containers_own_namespace_holds_it_below_its_servers_limit(tmp_path: Path) -> None:
    """Row 9c: the server at 2A, the namespace at A; a client without env in the namespace's directory gets A."""
    rows = run_rows(tmp_path)
    assert rows["9c"]["status"] == PASS, rows["9c"]
    (client,) = rows["9c"]["numbers"]["clients"]
    limit = client["limit_mib"]
    assert limit // 2 <= client["probe"]["allocated_mib"] <= limit < rows["9c"]["numbers"]["server_limit_mib"]
    assert rows["9c"]["numbers"]["pipe_directory"].endswith("/sm-sharing/gpufrac/c00000000009c")
    commands = [c["command"] for c in rows["9c"]["numbers"]["daemon"]]
    assert "namespace create c00000000009c --server=gpufrac" in commands


def test_a_daemon_side_that_holds_nothing_fails_both_rows(tmp_path: Path) -> None:
    """The control: an MPS that holds no client to a pinned limit (the env's nor the daemon's) fails 9a and 9b."""
    rows = run_rows(tmp_path, {"GPUFRAC_FAKE_CUDA_IGNORE_PINNED_LIMIT": "1"})
    assert rows["9a"]["status"] == FAIL and "not held" in rows["9a"]["details"], rows["9a"]
    assert rows["9b"]["status"] == FAIL, rows["9b"]
    assert rows["9c"]["status"] == FAIL, rows["9c"]


def test_an_env_naming_an_invisible_gpu_loses_the_namespaces_limit_as_nvidia_measured(tmp_path: Path) -> None:
    """Row 9d: the fake libcuda.so.1 follows NVIDIA's measurement (every pinned limit dropped); the row passes where
    the driver does that, and its numbers show both clients past the server's 2A."""
    rows = run_rows(tmp_path)
    assert rows["9d"]["status"] == PASS, rows["9d"]
    limit = rows["9c"]["numbers"]["clients"][0]["limit_mib"]
    assert all(mib > 2 * limit for mib in rows["9d"]["numbers"]["allocated_mib"]), rows["9d"]
    commands = [c["command"] for c in rows["9d"]["numbers"]["daemon"]]
    assert "namespace create c00000000009c --server=gpufrac" in commands


def test_a_namespaces_socket_refuses_control_commands_from_root_and_another_user(tmp_path: Path) -> None:
    """Row 9e on the fakes: the fake daemon's namespace sockets serve clients only (the real driver's answer is what
    the row is for); every try is recorded with its answer, and the daemon is still up after `quit` through it."""
    rows = run_rows(tmp_path)
    assert rows["9e"]["status"] == PASS, rows["9e"]
    tries = rows["9e"]["numbers"]["tries"]
    assert {t["command"].split()[0] for t in tries} == {"namespace", "server", "quit"}
    assert not any(t["accepted"] for t in tries), tries
    assert len(tries) == (6 if os.geteuid() == 0 else 3)
