"""The GPU check runs, against the fakes: the daemons it starts and stops, the "pod" namespaces, the table, the report,
the exit status, every CUDA client path against the fake libcuda.so.1, and the one file `make gpu-check-pyz` builds,
copied alone and run there."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from e2e.toolkit.wait import wait_until
from gpucheck import contract as restated
from gpucheck import judge, nvml
from gpucheck.cli import parse_args
from gpucheck.rows import FAIL, PASS, SKIPPED, Row
from gpucheck.session import Session
from gpufrac.agent.decide.mps_config import daemon_spec
from gpufrac.core.annotations import ComputeMode
from testkit.fakes.build import MPS_CONTROL, fake_cuda_library, fake_nvml_library

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "gpucheck" / "__main__.py"  # the check from the checkout, as the clients start there
WRAPPER = ROOT / "gpucheck" / "gpu_check.sh"
FAKE_NODE = ROOT / "testkit" / "fakes" / "gpu_check_node.json"
CUDA_ROWS = ("2a", "2b", "4a", "4b", "4c", "6a", "6b", "6c", "9a", "9b", "9c", "9d", "9e", "10", "11c", "11d")


# ---- the plumbing, against the fakes ----


def run_check(tmp_path: Path, *extra: str, env: dict[str, str] | None = None, state: Path = FAKE_NODE,
              wrapper: bool = False, cuda: bool = False, command: list[str] | None = None,
              cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The check (from the checkout, through its wrapper, or `command`) against the fake NVML and MPS control; with
    `cuda`, the fake libcuda.so.1 too (and the fake NVML lists its clients' processes), else a libcuda that does not
    exist."""
    if command is None:
        command = ["bash", str(WRAPPER)] if wrapper else [sys.executable, str(PROGRAM)]
    full_env = {**os.environ, "GPUFRAC_FAKE_NVML": str(state), "PYTHON": sys.executable, **(env or {})}
    library = str(tmp_path / "no-libcuda.so.1")
    if cuda:
        (tmp_path / "processes").mkdir()
        full_env.update(GPUFRAC_FAKE_GPU_PROCESSES=str(tmp_path / "processes"),
                        GPUFRAC_FAKE_CUDA_LOCK=str(tmp_path / "gpu.lock"), GPUFRAC_FAKE_CUDA_RATE="2e8")
        library = str(fake_cuda_library())
        extra = ("--spin-seconds", "0.5", *extra)
    return subprocess.run([*command, "--nvml", str(fake_nvml_library()), "--mps-control", str(MPS_CONTROL),
                           "--cuda", library, "--workdir", str(tmp_path / "work"),
                           "--out", str(tmp_path / "report.json"), *extra],
                          capture_output=True, text=True, env=full_env, timeout=240, check=False, cwd=cwd)


def checks(tmp_path: Path) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in json.loads((tmp_path / "report.json").read_text())["checks"]}


def records(tmp_path: Path, mode: str) -> list[dict[str, Any]]:
    path = tmp_path / "work" / "log" / mode / "fake-mps-record.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def unshare_works() -> bool:
    return subprocess.run(["unshare", "--mount", "--ipc", "--pid", "--fork", "--mount-proc", "true"],
                          capture_output=True, check=False).returncode == 0


def test_against_the_fakes_the_table_has_every_check_and_the_daemons_start_and_quit(tmp_path: Path) -> None:
    result = run_check(tmp_path, wrapper=True)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    status = {c["id"]: c["status"] for c in report["checks"]}
    assert set(status) == {"1", "2a", "2b", "3a", "3b", "3c", "4a", "4b", "4c", "5a", "5b", "6a", "6b", "6c", "7",
                           "8a", "8b", "8c", "9a", "9b", "9c", "9d", "9e", "10", "11a", "11b", "11c", "11d"}
    assert status["1"] == status["7"] == PASS
    details = {c["id"]: c["details"] for c in report["checks"]}
    for row in CUDA_ROWS:
        assert status[row] == SKIPPED and "no CUDA" in details[row], (row, details[row])
    assert all(status[r] == SKIPPED for r in ("3a", "3b", "3c", "5a", "5b", "11a", "11b"))
    assert "615.20" in details["1"] and "CUDA 13.4 memory limits: yes" in details["1"]
    # it ends with the table, which is also the .txt next to the report
    table = (tmp_path / "report.txt").read_text()
    assert table == report["table"] and table in result.stdout
    assert result.stdout.rstrip().splitlines()[-2].startswith("2 passed, 0 failed, 26 skipped")
    # each mode's daemon: started with the agent's argv in the agent's layout, told quit, exited 0, gone
    for mode in ComputeMode:
        spec = daemon_spec(mode, mps_v3=True, binary=str(MPS_CONTROL), mps_root=tmp_path / "work" / "mps",
                           log_root=tmp_path / "work" / "log", config_dir=tmp_path / "work" / "config")
        events = records(tmp_path, str(mode))
        start = next(e for e in events if e["event"] == "start")
        assert start["argv"][1:] == list(spec.argv[1:]) and start["pipe_dir"] == str(spec.pipe_dir)
        assert start["config"] == spec.config_text
        assert [e["command"] for e in events if e["event"] == "command" and e["command"] == "quit"] == ["quit"]
        assert [e["code"] for e in events if e["event"] == "exit"] == [0]
        assert not alive(start["pid"])
        assert not (spec.pipe_dir / "control").exists()


@pytest.mark.skipif(not unshare_works(), reason="unshare --mount --ipc --pid is not permitted here")
def test_against_the_fakes_pods_reach_the_daemon_only_through_the_delivered_pipe_directory(tmp_path: Path) -> None:
    result = run_check(tmp_path, "--only", "5")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    pods = {c["id"]: c for c in report["checks"] if c["id"] in ("5a", "5b")}
    assert "namespaces checked" in pods["5a"]["details"] and "namespaces checked" in pods["5b"]["details"]
    facts = pods["5a"]["numbers"]["pods"] + pods["5b"]["numbers"]["pods"]
    assert [f["pid"] for f in facts] == [1, 1, 1]
    assert [f["shm_marker_visible"] for f in facts] == [True, True, False]
    assert all(all(f["hidden"].values()) and f["control_socket"] for f in facts)
    host_ipc = os.readlink("/proc/self/ns/ipc")
    assert len({f["ns"]["ipc"] for f in facts[:2]} - {host_ipc}) == 2  # two pods at once: two IPC namespaces
    probes = [e for e in records(tmp_path, "sm-sharing") if e.get("command") == "get_server_list"]
    assert [e["via"] for e in probes] == ["socket"] * 3  # each pod reached the sm-sharing daemon
    assert not any(e.get("command") == "get_server_list" for e in records(tmp_path, "time-slicing"))


def test_a_failing_check_exits_non_zero_with_the_table(tmp_path: Path) -> None:
    state = tmp_path / "lost.json"
    state.write_text(json.dumps({**json.loads(FAKE_NODE.read_text()), "error": 15}))  # every NVML call: GPU lost
    result = run_check(tmp_path, state=state)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    inventory = next(c for c in report["checks"] if c["id"] == "1")
    assert inventory["status"] == FAIL and "GPU is lost" in inventory["details"]
    assert report["failed"] is True and "0 passed, 1 failed" in result.stdout


def test_a_daemon_that_ignores_quit_is_killed_and_the_check_fails(tmp_path: Path) -> None:
    result = run_check(tmp_path, "--only", "none", "--quit-timeout", "0.5", env={"FAKE_MPS_IGNORE_QUIT": "1"})
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    daemons = next(c for c in report["checks"] if c["id"] == "7")
    assert daemons["status"] == FAIL and "killed (ignored quit)" in daemons["details"]
    for mode in ComputeMode:
        events = records(tmp_path, str(mode))
        assert {e["via"] for e in events if e.get("command") == "quit"} == {"socket", "stdin"}
        assert not alive(next(e for e in events if e["event"] == "start")["pid"])


def test_sigterm_stops_the_daemons_and_exits_non_zero(tmp_path: Path) -> None:
    env = {**os.environ, "GPUFRAC_FAKE_NVML": str(FAKE_NODE), "GPUFRAC_FAKE_NVML_SETTINGS": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, str(PROGRAM), "--nvml", str(fake_nvml_library()), "--mps-control",
                             str(MPS_CONTROL), "--cuda", "none", "--workdir", str(tmp_path / "work"), "--out",
                             str(tmp_path / "report.json"), "--linger", "60"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        record = tmp_path / "work" / "log" / "sm-sharing" / "fake-mps-record.jsonl"

        def started() -> bool:
            assert proc.poll() is None, "the check exited before its daemons started"
            return record.exists() and '"start"' in record.read_text()

        wait_until(started, 30, "the check's sm-sharing daemon")
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output
    assert "interrupted by SIGTERM" in output
    for mode in ComputeMode:
        events = records(tmp_path, str(mode))
        assert any(e.get("command") == "quit" for e in events)
        assert [e["code"] for e in events if e["event"] == "exit"] == [0]
        assert not alive(next(e for e in events if e["event"] == "start")["pid"])
    assert json.loads((tmp_path / "report.json").read_text())["interrupted"] == "SIGTERM"


# ---- the CUDA clients, against the fake libcuda.so.1 (testkit/fakes/fake_cuda.c) ----


def test_with_fake_cuda_every_client_path_runs_and_passes(tmp_path: Path) -> None:
    # the fake refuses sm_90 PTX: the client falls back to the next target; check 3 needs cgroup v2, left out.
    # 1.5 s spins: "together" (4a) allows 0.5 s between the two clients' starts, which a loaded 2-core CI machine
    # can take to wake a client after "go"; with 0.5 s spins 0.18 s was enough to fail it.
    result = run_check(tmp_path, "--only", "2,4,5,6", "--spin-seconds", "1.5", cuda=True,
                       env={"GPUFRAC_FAKE_CUDA_REJECT_TARGET": "sm_90"})
    assert result.returncode == 0, result.stdout + result.stderr
    rows = checks(tmp_path)
    pods = unshare_works()
    expected = {"1", "2a", "2b", "4a", "4b", "4c", "5a", "5b", "6a", "6b", "6c", "7"}
    assert set(rows) == expected
    assert {r for r, c in rows.items() if c["status"] != PASS} == (set() if pods else {"5a", "5b"})
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["raw"]["cuda"]["device"]["ptx_target"] == "sm_75 (PTX ISA 6.3)"
    assert report["raw"]["cuda"]["device"]["sm_count"] == 132
    solo = report["raw"]["cuda"]["calibration"]["solo_s"]
    assert 1.2 < solo < 2.4  # calibrated to --spin-seconds 1.5
    for row in ("2a", "2b"):  # each client got exactly its pinned limit (the fake has no context overhead)
        got = [(c["limit_mib"], c["probe"]["allocated_mib"], c["probe"]["stopped_by"])
               for c in rows[row]["numbers"]["clients"]]
        assert got == [(2048, 2048, "oom"), (4096, 4096, "oom")]
    assert rows["4a"]["numbers"]["span_s"] < 1.35 * solo <= 1.65 * solo < rows["4b"]["numbers"]["span_s"]
    assert rows["4c"]["numbers"]["span_s"] > 1.65 * solo
    attribution = rows["6a"]["numbers"]
    assert sorted(attribution["memory_mib"][str(p)] for p in attribution["client_pids"]) == [1024, 1024]
    assert all(attribution["sm_util"][str(p)] == 95 for p in attribution["client_pids"])
    assert rows["6c"]["numbers"]["mps_memory_charged_to"] == "client"  # the fake lists each client's own
    if pods:
        assert "is NOT needed" in rows["5b"]["details"] and rows["5b"]["numbers"]["shm_needed"] is False
        assert [c["probe"]["allocated_mib"] for c in rows["5a"]["numbers"]["clients"]] == [2048, 4096]
    assert not list((tmp_path / "processes").glob("*.json"))  # every client released its context


@pytest.mark.skipif(not unshare_works(), reason="unshare --mount --ipc --pid is not permitted here")
def test_with_fake_cuda_a_pod_that_needs_the_daemons_shm_says_so(tmp_path: Path) -> None:
    marker = Path(f"/dev/shm/gpufrac-test-{os.getpid()}")
    marker.write_text("the fake MPS needs this\n")
    try:
        result = run_check(tmp_path, "--only", "5", cuda=True, env={"GPUFRAC_FAKE_CUDA_NEEDS_SHM": str(marker)})
    finally:
        marker.unlink()
    assert result.returncode == 0, result.stdout + result.stderr
    rows = checks(tmp_path)
    assert rows["5a"]["status"] == PASS
    assert rows["5b"]["status"] == PASS and rows["5b"]["numbers"]["shm_needed"] is True
    assert "IS needed" in rows["5b"]["details"] and "CUDA_ERROR_MPS_CONNECTION_FAILED" in rows["5b"]["details"]


def test_with_fake_cuda_a_limit_that_does_not_hold_fails_the_check(tmp_path: Path) -> None:
    result = run_check(tmp_path, "--only", "2", cuda=True, env={"GPUFRAC_FAKE_CUDA_IGNORE_PINNED_LIMIT": "1"})
    assert result.returncode == 1, result.stdout + result.stderr
    rows = checks(tmp_path)
    for row in ("2a", "2b"):
        assert rows[row]["status"] == FAIL and "not held" in rows[row]["details"]
        probes = [c["probe"] for c in rows[row]["numbers"]["clients"]]
        assert [(p["stopped_by"], p["allocated_mib"]) for p in probes] == [
            ("max", judge.probe_max_mib(2048) // 4 * 4), ("max", judge.probe_max_mib(4096) // 4 * 4)]
    assert "2 failed" in result.stdout


def test_a_check_that_raises_fails_alone_and_the_run_goes_on(tmp_path: Path) -> None:
    session = Session(parse_args(["--cuda", "none", "--workdir", str(tmp_path)]))
    session.guarded("4", lambda: {}["missing"])
    session.guarded("5", lambda: session.add(Row("5", "next", PASS, "ran")))
    assert [(r.id, r.status) for r in session.rows] == [("4", FAIL), ("5", PASS)]
    assert "internal error: KeyError" in session.rows[0].details
    assert "KeyError" in session.raw["internal_errors"][0]


def cgroup2_mountable() -> bool:
    return subprocess.run(["unshare", "--mount", "sh", "-c", "mount -t cgroup2 none /sys/fs/cgroup"],
                          capture_output=True, check=False).returncode == 0


def cgroup2_entries() -> list[str]:
    listing = subprocess.run(["unshare", "--mount", "sh", "-c", "mount -t cgroup2 none /sys/fs/cgroup && "
                              "ls /sys/fs/cgroup"], capture_output=True, text=True, check=True)
    return listing.stdout.split()


@pytest.mark.skipif(not cgroup2_mountable(), reason="cannot mount cgroup2 in a private mount namespace here")
def test_with_fake_cuda_the_cuda_13_4_limits_hold_clients_in_their_cgroups(tmp_path: Path) -> None:
    # the whole check in a mount namespace whose /sys/fs/cgroup is the (real, kernel) cgroup v2 hierarchy
    before = set(cgroup2_entries())
    env = {**os.environ, "GPUFRAC_FAKE_NVML": str(FAKE_NODE),
           "GPUFRAC_FAKE_NVML_SETTINGS": str(tmp_path), "GPUFRAC_FAKE_GPU_PROCESSES": str(tmp_path),
           "GPUFRAC_FAKE_CUDA_LOCK": str(tmp_path / "gpu.lock"), "GPUFRAC_FAKE_CUDA_RATE": "2e8"}
    command = (f"mount -t cgroup2 none /sys/fs/cgroup && exec {sys.executable} {PROGRAM} --nvml {fake_nvml_library()}"
               f" --cuda {fake_cuda_library()} --mps-control {MPS_CONTROL} --workdir {tmp_path / 'work'}"
               f" --out {tmp_path / 'report.json'} --spin-seconds 0.5 --only 3")
    result = subprocess.run(["unshare", "--mount", "sh", "-c", command], capture_output=True, text=True, env=env,
                            timeout=240, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = checks(tmp_path)
    for row in ("3a", "3b", "3c"):
        assert rows[row]["status"] == PASS, rows[row]
        cgroups = rows[row]["numbers"]["cgroups"]
        assert [c["env"] for c in cgroups] == [{restated.ENV_MEMORY_REQUEST: "1024", restated.ENV_MEMORY_LIMIT: "2048"},
                                               {restated.ENV_MEMORY_REQUEST: "2048", restated.ENV_MEMORY_LIMIT: "4096"}]
        assert [(c["read_back"]["soft"], c["read_back"]["hard"]) for c in cgroups] == [
            (1024 * restated.MIB, 2048 * restated.MIB), (2048 * restated.MIB, 4096 * restated.MIB)]
        assert [c["probe"]["allocated_mib"] for c in rows[row]["numbers"]["clients"]] == [2048, 4096]
    # afterwards: every leaf's limit cleared (soft 0, hard max) before its cgroup was removed, and none is left
    limits = (tmp_path / "memory-limits").read_text().splitlines()
    leaves = {line.split()[2] for line in limits}
    assert len(leaves) == 6 and all(f"{nvml.NVML_DEVICE_MEMORY_LIMIT_MAX} 0 {leaf}" in limits for leaf in leaves)
    assert "could not remove cgroup" not in result.stdout
    assert set(cgroup2_entries()) == before


def test_checks_past_the_time_budget_are_skipped_and_the_daemons_still_stop(tmp_path: Path) -> None:
    result = run_check(tmp_path, "--budget", "1", cuda=True)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = checks(tmp_path)
    skipped = {r for r, c in rows.items() if c["status"] == SKIPPED and "time budget" in c["details"]}
    assert skipped == {"2a", "2b", "3a", "3b", "3c", "4a", "4b", "4c", "5a", "5b", "6a", "6b", "6c", "8a", "8b", "8c",
                       "9a", "9b", "9c", "9d", "9e", "10", "11a", "11b", "11c", "11d"}
    assert rows["1"]["status"] == rows["7"]["status"] == PASS


def test_without_crictl_or_an_image_the_runtime_checks_say_why_they_are_skipped(tmp_path: Path) -> None:
    no_crictl = run_check(tmp_path / "a", "--only", "8", "--crictl", str(tmp_path / "no-crictl"), "--image", "x")
    assert no_crictl.returncode == 0, no_crictl.stdout + no_crictl.stderr
    rows = checks(tmp_path / "a")
    assert rows["8a"]["status"] == rows["8b"]["status"] == SKIPPED
    assert "crictl" in rows["8a"]["details"]
    run_check(tmp_path / "b", "--only", "8", "--crictl", "/bin/true", "--runtime-endpoint", "unix:///nonexistent.sock")
    assert "no CRI socket at unix:///nonexistent.sock" in checks(tmp_path / "b")["8b"]["details"]
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(tmp_path / "cri.sock"))
    try:  # crictl answers no images (/bin/true prints nothing): no gpufrac image to use
        run_check(tmp_path / "c", "--only", "8", "--crictl", "/bin/true", "--runtime-endpoint",
                  f"unix://{tmp_path / 'cri.sock'}")
    finally:
        listening.close()
    assert "no --image, and no gpufrac image on the node" in checks(tmp_path / "c")["8c"]["details"]


# ---- the one file: the package built into a zipapp, copied alone, run there ----


def test_the_one_file_built_from_the_package_runs_alone_with_its_clients_and_pods(tmp_path: Path) -> None:
    """What docs/gpu-check.md has a person do: build gpu_check.pyz, copy that one file to a node, run it there with
    python3. Here the "node" is an empty directory outside the checkout, python3 runs without site-packages (-S: the
    standard library and the archive only), and the check's clients (rows 1c, 2) and pods (5) start from the copied
    file itself."""
    built = subprocess.run([sys.executable, "-m", "gpucheck.build", "--out", str(tmp_path / "build" / "gpu_check.pyz")],
                           cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert built.returncode == 0, built.stderr
    node = tmp_path / "node"
    node.mkdir()
    shutil.copy(built.stdout.strip(), node)  # scp: the one file
    with zipfile.ZipFile(node / "gpu_check.pyz") as archive:
        files = sorted(name for name in archive.namelist() if not name.endswith("/"))
    package = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "gpucheck").rglob("*.py")
                     if "__pycache__" not in path.parts and path.name != "build.py")
    assert files == sorted(["__main__.py", *package])  # the package's modules and zipapp's entry, nothing else
    result = run_check(tmp_path, "--only", "2,5", cuda=True, command=[sys.executable, "-S", "gpu_check.pyz"], cwd=node)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = checks(tmp_path)
    assert set(rows) == {"1", "2a", "2b", "5a", "5b", "7"}
    assert {r for r, c in rows.items() if c["status"] != PASS} == (set() if unshare_works() else {"5a", "5b"})
    for row in ("2a", "2b"):  # two clients each, started as `python3 gpu_check.pyz --client ...`, each held
        assert [(c["limit_mib"], c["probe"]["allocated_mib"], c["probe"]["stopped_by"])
                for c in rows[row]["numbers"]["clients"]] == [(2048, 2048, "oom"), (4096, 4096, "oom")]
    if unshare_works():  # the pods' clients started from the copied file inside their own mount namespaces
        assert [c["probe"]["allocated_mib"] for c in rows["5a"]["numbers"]["clients"]] == [2048, 4096]
    report = json.loads((tmp_path / "report.json").read_text())
    table = (tmp_path / "report.txt").read_text()
    assert table == report["table"] and table in result.stdout
    assert table.splitlines()[1].split() == ["#", "check", "status", "details"]
    assert table.rstrip().splitlines()[-1].startswith(f"{len(rows) - (0 if unshare_works() else 2)} passed, 0 failed")
    assert report["raw"]["cuda"]["device"]["sm_count"] == 132  # row 1c's client: the fake H200's device facts


def test_building_the_one_file_where_it_cannot_be_written_says_so_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    built = subprocess.run([sys.executable, "-m", "gpucheck.build", "--out", str(tmp_path / "file" / "x.pyz")],
                           cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert built.returncode == 1 and built.stdout == ""
    assert built.stderr.startswith("gpucheck.build: cannot write ") and len(built.stderr.splitlines()) == 1
