"""gpucheck/gpu_check.py, the hardware check: its restated contract equals gpufrac's, its ctypes layouts equal NVIDIA's
own (nvidia-ml-py), its PTX is well formed, its judgements decide right, and its plumbing (the daemons it starts
and stops, the "pod" namespaces, the table, the report, the exit status) works against the fakes."""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest

from e2e.toolkit import gpu_devices
from e2e.toolkit.wait import wait_until
from gpucheck import gpu_check as gc
from gpufrac.agent.decide import capabilities
from gpufrac.agent.decide.model import GpuInfo, Inventory
from gpufrac.agent.decide.mps_config import daemon_spec, render_config
from gpufrac.agent.decide.nri_decision import ContainerInfo, Injection, NodeFacts, Outcome, PodInfo, decide
from gpufrac.agent.programs.agent_config import AgentConfig
from gpufrac.core import contract
from gpufrac.core.annotations import CANONICAL_PREFIX, NVIDIA_PREFIX, CanonicalField, ComputeMode
from gpufrac.core.contract import DEFAULT_MPS_ROOT, Delivery, LimitEnv
from gpufrac.webhook.decide.fractions import ContainerFraction, Memory, PodFractions
from gpufrac.webhook.decide.mutation import canonical_annotations, injected_env, injected_mounts, injected_volumes
from gpufrac.webhook.decide.policy import Policy
from testkit.fakes.build import MPS_CONTROL, fake_cuda_library, fake_nvml_library

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "gpucheck" / "gpu_check.py"
WRAPPER = ROOT / "gpucheck" / "gpu_check.sh"
FAKE_NODE = ROOT / "testkit" / "fakes" / "gpu_check_node.json"
CUDA_ROWS = ("2a", "2b", "4a", "4b", "4c", "6a", "6b")

# ---- the restated contract equals gpufrac's own ----


def test_modes_paths_and_env_names_are_gpufracs() -> None:
    assert gc.MODES == tuple(str(m) for m in ComputeMode)
    assert (gc.TIME_SLICING, gc.SM_SHARING) == (ComputeMode.TIME_SLICING, ComputeMode.SM_SHARING)
    config = AgentConfig(node="n")
    assert gc.GPUFRAC_MPS_ROOT == DEFAULT_MPS_ROOT == str(config.mps_root)
    assert gc.GPUFRAC_MPS_LOG_ROOT == str(config.mps_log_root)
    assert gc.GPUFRAC_MPS_CONFIG_DIR == str(config.mps_config_dir)
    assert gc.ENV_PIPE_DIRECTORY == LimitEnv.PIPE_DIRECTORY
    assert gc.ENV_PINNED_MEM_LIMIT == LimitEnv.PINNED_MEM_LIMIT
    assert gc.ENV_MEMORY_REQUEST == LimitEnv.MEMORY_REQUEST
    assert gc.ENV_MEMORY_LIMIT == LimitEnv.MEMORY_LIMIT
    assert gc.MIN_DRIVER_MAJOR == capabilities.MIN_DRIVER_MAJOR
    assert gc.MIN_CUDA_DRIVER_VERSION == capabilities.MIN_CUDA_DRIVER_VERSION
    assert gc.MIB == contract.MIB
    for mode in ComputeMode:  # the pipe directory and its control socket
        layout = gc.daemon_layout("/r", str(mode))
        assert layout.pipe_dir == contract.mps_pipe_dir("/r/mps", mode)
        assert os.path.basename(layout.control_socket) == contract.MPS_CONTROL_SOCKET


def test_clients_and_daemons_start_from_an_env_without_the_callers_limits(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LimitEnv:
        monkeypatch.setenv(name, "0=1M")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    session = gc.Session(gc.parse_args(["--cuda", "none", "--workdir", str(tmp_path)]))
    base = session.base_env()
    assert not [k for k in base if k.startswith(contract.LIMIT_ENV_PREFIXES) or k == "CUDA_VISIBLE_DEVICES"]
    assert base["PATH"] == os.environ["PATH"]
    session.node.gpu_uuid = "GPU-x"
    env = session.client_env("/p", {gc.ENV_PINNED_MEM_LIMIT: "0=2M"})
    assert (env[gc.ENV_PIPE_DIRECTORY], env["CUDA_VISIBLE_DEVICES"], env[gc.ENV_PINNED_MEM_LIMIT]) == (
        "/p", "GPU-x", "0=2M")
    assert gc.ENV_MEMORY_LIMIT not in env


@pytest.mark.parametrize("mode", list(ComputeMode))
@pytest.mark.parametrize("mps_v3", [True, False])
def test_daemon_layout_argv_env_and_config_are_the_agents(tmp_path: Path, mode: ComputeMode, mps_v3: bool) -> None:
    base = {"PATH": "/usr/bin", "HOME": "/root"}
    spec = daemon_spec(mode, mps_v3=mps_v3, binary="/usr/bin/nvidia-cuda-mps-control", mps_root=tmp_path / "mps",
                       log_root=tmp_path / "log", config_dir=tmp_path / "config", base_env=base)
    layout = gc.daemon_layout(str(tmp_path), str(mode))
    assert layout.pipe_dir == str(spec.pipe_dir)
    assert layout.log_dir == str(spec.log_dir)
    assert layout.control_socket == str(spec.control_socket)
    assert gc.daemon_argv("/usr/bin/nvidia-cuda-mps-control", str(mode), mps_v3, layout.config_path) == spec.argv
    assert gc.daemon_env(base, layout) == spec.env
    if mps_v3:
        assert layout.config_path == str(spec.config_path)
        assert gc.render_config(str(mode)) == spec.config_text == render_config(mode)
        assert gc.render_config(str(mode), audit_log=False) == render_config(mode, audit_log=False)
    else:
        assert spec.config_path is None


@pytest.mark.parametrize(("limit_mib", "devices"), [(954, 1), (61440, 2), (1, 8)])
def test_limit_values_are_formatted_as_the_webhook_writes_them(limit_mib: int, devices: int) -> None:
    assert gc.format_pinned_mem_limit(limit_mib, devices) == contract.format_pinned_mem_limit(
        contract.pinned_limits(limit_mib, devices))
    assert contract.parse_pinned_mem_limit(gc.format_pinned_mem_limit(limit_mib, devices)) == dict.fromkeys(
        range(devices), limit_mib)
    fraction = ContainerFraction("app", ComputeMode.SM_SHARING, devices, Memory(limit_mib // 2 or 1, limit_mib),
                                 None, ())
    written = canonical_annotations(PodFractions({"app": fraction}, {}))
    env = {e["name"]: e for e in injected_env("app", ComputeMode.SM_SHARING, Policy())}

    def annotation_behind(name: str) -> str:  # the env var's value is the annotation its fieldRef names
        path = env[name]["valueFrom"]["fieldRef"]["fieldPath"]
        return written[re.fullmatch(r"metadata\.annotations\['(.+)'\]", path)[1]]

    assert annotation_behind(gc.ENV_MEMORY_REQUEST) == gc.memory_env_value(limit_mib // 2 or 1)
    assert annotation_behind(gc.ENV_MEMORY_LIMIT) == gc.memory_env_value(limit_mib)
    assert annotation_behind(gc.ENV_PINNED_MEM_LIMIT) == gc.format_pinned_mem_limit(limit_mib, devices)
    assert any(k.endswith(str(CanonicalField.MPS_PINNED_MEM_LIMIT)) for k in written)


def test_pods_get_the_pipe_directory_at_its_host_path_as_the_webhook_mounts_it(tmp_path: Path) -> None:
    for policy in (Policy(), Policy(delivery=Delivery.HOST_PATH)):
        for mode in ComputeMode:  # the pod emulation binds the pipe directory at the same path, like the webhook
            pipe_mount, shm_mount = injected_mounts(mode, policy)
            assert pipe_mount["mountPath"] == policy.mps_dirs[mode]
            assert shm_mount["mountPath"] == "/dev/shm"
            assert injected_env("c", mode, policy)[-1] == {"name": gc.ENV_PIPE_DIRECTORY,
                                                           "value": policy.mps_dirs[mode]}
            if policy.delivery is Delivery.HOST_PATH:  # the CSI driver binds the same host directory there
                assert injected_volumes(mode, policy)[0]["hostPath"]["path"] == policy.mps_dirs[mode]
    policy = Policy()
    run = gc.Run(gc.parse_args(["--workdir", str(tmp_path)]))
    run.session.node.mps_control = "/bin/true"
    spec = run.pods.spec(shm_delivered=True)
    assert spec["deliver"] == [{"source": spec["pipe_dir"], "target": spec["pipe_dir"]}]
    assert str(tmp_path) in spec["hide"]


@pytest.mark.parametrize(("driver", "cuda"), [("615.20", 13040), ("615.20", 13030), ("614.99", 13040),
                                              ("580.95.05", 13000), ("620.1", 13050), ("garbage", 13040)])
def test_driver_limits_and_served_modes_decide_as_the_agent(driver: str, cuda: int) -> None:
    inventory = Inventory(driver, cuda, (GpuInfo(0, "GPU-a", "H200", 1 << 30),))
    expected = capabilities.has_driver_memory_limits(inventory)
    assert gc.has_driver_memory_limits(driver, cuda) == expected
    assert gc.modes_to_serve(expected) == tuple(
        str(m) for m in capabilities.modes_to_serve(inventory, tuple(ComputeMode)))


# ---- the ctypes layouts equal NVIDIA's own nvidia-ml-py ----


@pytest.mark.parametrize(("ours", "theirs"), [
    (gc.NvmlMemory, pynvml.c_nvmlMemory_t),
    (gc.NvmlProcessInfo, pynvml.c_nvmlProcessInfo_v3_t),  # what ..._GetComputeRunningProcesses_v3 fills
    (gc.NvmlProcessUtilizationSample, pynvml.c_nvmlProcessUtilizationSample_t),
    (gc.NvmlSetMemoryLimits, pynvml.c_nvmlSetMemoryLimits_v1_t),
    (gc.NvmlGetMemoryLimits, pynvml.c_nvmlGetMemoryLimits_v1_t),
])
def test_nvml_structs_match_nvidia_ml_py(ours: type[ctypes.Structure], theirs: type[ctypes.Structure]) -> None:
    assert [(n, ctypes.sizeof(t)) for n, t in ours._fields_] == [(n, ctypes.sizeof(t)) for n, t in theirs._fields_]
    assert ctypes.sizeof(ours) == ctypes.sizeof(theirs)
    for name, _ in ours._fields_:
        assert getattr(ours, name).offset == getattr(theirs, name).offset


def test_nvml_struct_sizes_on_x86_64() -> None:
    sizes = {gc.NvmlMemory: 24, gc.NvmlProcessInfo: 24, gc.NvmlProcessUtilizationSample: 32,
             gc.NvmlSetMemoryLimits: 24, gc.NvmlGetMemoryLimits: 32}
    assert {s: ctypes.sizeof(s) for s in sizes} == sizes
    assert gc.NVML_DEVICE_MEMORY_LIMIT_MAX == pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX
    assert gc.COMPUTE_MODES[3] == "Exclusive_Process" and pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS == 3


def test_nvml_wrapper_reads_the_fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "nvml.json"
    state.write_text(json.dumps({"driver_version": "615.20", "cuda_driver_version": 13040, "gpus": [
        {"uuid": "GPU-a", "name": "NVIDIA H200", "memory_total_mib": 1000, "compute_mode": 3,
         "processes": [{"pid": 11, "used_memory_mib": 300, "sm_util": 40}, {"pid": 12, "used_memory_mib": 5}]}]}))
    monkeypatch.setenv("GPUFRAC_FAKE_NVML", str(state))
    nvml = gc.Nvml(str(fake_nvml_library()))
    nvml.init()
    handle = nvml.handle(0)
    assert (nvml.driver_version(), nvml.cuda_driver_version(), nvml.device_count()) == ("615.20", 13040, 1)
    assert (nvml.uuid(handle), nvml.name(handle), nvml.memory(handle).total) == ("GPU-a", "NVIDIA H200", 1000 * gc.MIB)
    assert nvml.compute_mode(handle) == "Exclusive_Process"
    assert nvml.processes(handle) == {11: 300 * gc.MIB, 12: 5 * gc.MIB}
    assert [(pid, sm) for pid, _, sm in nvml.utilization(handle, 0)] == [(11, 40)]
    assert nvml.utilization(handle, int(time.time() * 1e6) + 10**9) == []  # nothing newer: NOT_FOUND
    nvml.set_memory_limits(handle, "/sys/fs/cgroup/x", 1 * gc.MIB, 2 * gc.MIB)
    assert nvml.get_memory_limits(handle, "/sys/fs/cgroup/x") == {"soft": gc.MIB, "hard": 2 * gc.MIB, "used": 0}
    assert nvml.mig_enabled(handle) is None  # the fake has no nvmlDeviceGetMigMode: optional, not a crash
    nvml.shutdown()


# ---- the PTX kernel is well formed ----

PTX_OPCODES = {"ld.param.u64", "cvta.to.global.u64", "mov.u64", "mov.f32", "mov.u32", "setp.eq.u64", "setp.lt.u64",
               "setp.ne.u32", "bra", "fma.rn.f32", "add.u64", "mad.lo.u32", "mul.wide.u32", "st.global.f32",
               "or.b32", "st.global.u64", "ret"}


def check_ptx(text: str) -> None:
    lines = [line.split("//")[0].strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    version, target, address = lines[:3]
    assert re.fullmatch(r"\.version \d+\.\d+", version)
    assert re.fullmatch(r"\.target sm_\d+", target)
    assert address == ".address_size 64"
    assert float(version.split()[1]) >= 3.1  # %globaltimer needs PTX ISA 3.1
    assert text.count("{") == text.count("}") == 1  # one body: the template's {{ }} came out single
    entry = re.search(r"\.visible \.entry (\w+)\(\s*(.*?)\)\s*\{(.*)\}", text, re.S)
    assert entry and entry[1] == gc.KERNEL_NAME
    params = re.findall(r"\.param \.u64 (\w+)", entry[2])
    assert params == ["gpufrac_spin_out", "gpufrac_spin_iterations"]  # (out pointer, iterations): kernelParams
    body = [line for line in entry[3].splitlines() if line.strip()]
    declared = {m[1]: int(m[2]) for m in re.finditer(r"\.reg \.\w+\s+%(\w+)<(\d+)>;", entry[3])}
    labels = {line.strip()[:-1] for line in body if line.strip().endswith(":")}
    for line in body:
        line = line.strip()
        if line.startswith(".reg") or line.endswith(":"):
            continue
        assert line.endswith(";"), line
        instruction = re.sub(r"^@%\w+\s+", "", line[:-1])
        opcode, _, operands = instruction.partition("\t") if "\t" in instruction else instruction.partition(" ")
        assert opcode.strip() in PTX_OPCODES, opcode
        for name, number in re.findall(r"%([a-z]+)(\d+)", line):
            assert name in declared and int(number) < declared[name], f"{name}{number} undeclared in {line}"
        for param in re.findall(r"\[(\w+)\]", operands):
            assert param in params
        if opcode.strip() == "bra":
            assert operands.strip() in labels
    specials = set(re.findall(r"%(globaltimer|tid\.x|ctaid\.x|ntid\.x)\b", entry[3]))
    assert specials == {"globaltimer", "tid.x", "ctaid.x", "ntid.x"}


@pytest.mark.parametrize(("cc", "first"), [((9, 0), ("sm_90", "7.8")), ((8, 0), ("sm_80", "7.0")),
                                           ((12, 0), ("sm_120", "8.7")), ((7, 5), ("sm_75", "6.3")),
                                           ((11, 9), ("sm_75", "6.3"))])
def test_ptx_for_each_candidate_target_is_well_formed(cc: tuple[int, int], first: tuple[str, str]) -> None:
    candidates = gc.ptx_candidates(*cc)
    assert candidates[0] == first
    assert candidates[-1] == ("sm_50", "4.0") and len(set(candidates)) == len(candidates)
    for target, isa in candidates:
        check_ptx(gc.ptx_source(target, isa))


def test_ptx_check_catches_a_broken_kernel() -> None:
    good = gc.ptx_source("sm_90", "7.8")
    for broken in (good.replace("%rd8+16", "%rd9+16"), good.replace("$L_loop;", "$L_nowhere;"),
                   good.replace("ret;", "ret"), good.replace(".address_size 64", ".address_size 32")):
        with pytest.raises(AssertionError):
            check_ptx(broken)


# ---- the judgements ----


@pytest.mark.parametrize(("probe", "status"), [
    ({"allocated_mib": 1900, "stopped_by": "oom"}, gc.PASS),
    ({"allocated_mib": 1100, "stopped_by": "oom"}, gc.PASS),
    ({"allocated_mib": 900, "stopped_by": "oom"}, gc.FAIL),  # less than half: not "up to the limit"
    ({"allocated_mib": 2100, "stopped_by": "oom"}, gc.FAIL),  # past the limit
    ({"allocated_mib": 3328, "stopped_by": "max"}, gc.FAIL),  # never failed: no limit at all
    ({"allocated_mib": 1900, "stopped_by": "error", "error_name": "CUDA_ERROR_MPS_CLIENT_TERMINATED"}, gc.FAIL),
])
def test_judge_probe(probe: dict[str, Any], status: str) -> None:
    assert gc.judge_probe(2048, probe)[0] == status


@pytest.mark.parametrize(("expect", "span", "status"), [
    ("together", 3.1, gc.PASS), ("together", 4.5, gc.FAIL), ("turns", 6.0, gc.PASS), ("turns", 4.5, gc.FAIL),
    ("turns", 3.2, gc.FAIL)])
def test_judge_compute(expect: str, span: float, status: str) -> None:
    assert gc.judge_compute(expect, 3.0, span)[0] == status


def test_judge_pod() -> None:
    host = {"ipc": "ipc:[1]", "mnt": "mnt:[2]", "pid": "pid:[3]"}
    good = {"pid": 1, "ns": {"ipc": "ipc:[9]", "mnt": "mnt:[8]", "pid": "pid:[7]"}, "control_socket": True,
            "hidden": {"/x/log": True}, "shm_marker_visible": True, "control_probe": {"rc": 0, "output": ""}}
    assert gc.judge_pod(good, host, shm_delivered=True) == []
    assert gc.judge_pod(good, host, shm_delivered=False) == ["sees the daemon's /dev/shm"]
    bad = {**good, "pid": 4242, "ns": {**good["ns"], "ipc": "ipc:[1]"}, "hidden": {"/x/log": False},
           "control_probe": {"rc": 1, "output": "Cannot find MPS control daemon process"}}
    problems = gc.judge_pod(bad, host, shm_delivered=True)
    assert len(problems) == 4 and any("Cannot find MPS control" in p for p in problems)


# ---- the plumbing, against the fakes ----


def run_check(tmp_path: Path, *extra: str, env: dict[str, str] | None = None, state: Path = FAKE_NODE,
              wrapper: bool = False, cuda: bool = False) -> subprocess.CompletedProcess[str]:
    """The check against the fake NVML and MPS control; with `cuda`, the fake libcuda.so.1 too (and the fake NVML
    lists its clients' processes), else a libcuda that does not exist."""
    command = ["bash", str(WRAPPER)] if wrapper else [sys.executable, str(SCRIPT)]
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
                          capture_output=True, text=True, env=full_env, timeout=240, check=False)


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
    assert set(status) == {"1", "2a", "2b", "3a", "3b", "3c", "4a", "4b", "4c", "5a", "5b", "6a", "6b", "7", "8a", "8b",
                           "8c"}
    assert status["1"] == status["7"] == gc.PASS
    details = {c["id"]: c["details"] for c in report["checks"]}
    for row in CUDA_ROWS:
        assert status[row] == gc.SKIPPED and "no CUDA" in details[row], (row, details[row])
    assert all(status[r] == gc.SKIPPED for r in ("3a", "3b", "3c", "5a", "5b"))
    assert "615.20" in details["1"] and "CUDA 13.4 memory limits: yes" in details["1"]
    # it ends with the table, which is also the .txt next to the report
    table = (tmp_path / "report.txt").read_text()
    assert table == report["table"] and table in result.stdout
    assert result.stdout.rstrip().splitlines()[-2].startswith("2 passed, 0 failed, 15 skipped")
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
    assert inventory["status"] == gc.FAIL and "GPU is lost" in inventory["details"]
    assert report["failed"] is True and "0 passed, 1 failed" in result.stdout


def test_a_daemon_that_ignores_quit_is_killed_and_the_check_fails(tmp_path: Path) -> None:
    result = run_check(tmp_path, "--only", "none", "--quit-timeout", "0.5", env={"FAKE_MPS_IGNORE_QUIT": "1"})
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    daemons = next(c for c in report["checks"] if c["id"] == "7")
    assert daemons["status"] == gc.FAIL and "killed (ignored quit)" in daemons["details"]
    for mode in ComputeMode:
        events = records(tmp_path, str(mode))
        assert {e["via"] for e in events if e.get("command") == "quit"} == {"socket", "stdin"}
        assert not alive(next(e for e in events if e["event"] == "start")["pid"])


def test_sigterm_stops_the_daemons_and_exits_non_zero(tmp_path: Path) -> None:
    env = {**os.environ, "GPUFRAC_FAKE_NVML": str(FAKE_NODE)}
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--nvml", str(fake_nvml_library()), "--mps-control",
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
    expected = {"1", "2a", "2b", "4a", "4b", "4c", "5a", "5b", "6a", "6b", "7"}
    assert set(rows) == expected
    assert {r for r, c in rows.items() if c["status"] != gc.PASS} == (set() if pods else {"5a", "5b"})
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
    assert rows["5a"]["status"] == gc.PASS
    assert rows["5b"]["status"] == gc.PASS and rows["5b"]["numbers"]["shm_needed"] is True
    assert "IS needed" in rows["5b"]["details"] and "CUDA_ERROR_MPS_CONNECTION_FAILED" in rows["5b"]["details"]


def test_with_fake_cuda_a_limit_that_does_not_hold_fails_the_check(tmp_path: Path) -> None:
    result = run_check(tmp_path, "--only", "2", cuda=True, env={"GPUFRAC_FAKE_CUDA_IGNORE_PINNED_LIMIT": "1"})
    assert result.returncode == 1, result.stdout + result.stderr
    rows = checks(tmp_path)
    for row in ("2a", "2b"):
        assert rows[row]["status"] == gc.FAIL and "not held" in rows[row]["details"]
        probes = [c["probe"] for c in rows[row]["numbers"]["clients"]]
        assert [(p["stopped_by"], p["allocated_mib"]) for p in probes] == [
            ("max", gc.probe_max_mib(2048) // 4 * 4), ("max", gc.probe_max_mib(4096) // 4 * 4)]
    assert "2 failed" in result.stdout


def test_a_check_that_raises_fails_alone_and_the_run_goes_on(tmp_path: Path) -> None:
    session = gc.Session(gc.parse_args(["--cuda", "none", "--workdir", str(tmp_path)]))
    session.guarded("4", lambda: {}["missing"])
    session.guarded("5", lambda: session.add(gc.Row("5", "next", gc.PASS, "ran")))
    assert [(r.id, r.status) for r in session.rows] == [("4", gc.FAIL), ("5", gc.PASS)]
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
    env = {**os.environ, "GPUFRAC_FAKE_NVML": str(FAKE_NODE), "GPUFRAC_FAKE_GPU_PROCESSES": str(tmp_path),
           "GPUFRAC_FAKE_CUDA_LOCK": str(tmp_path / "gpu.lock"), "GPUFRAC_FAKE_CUDA_RATE": "2e8"}
    command = (f"mount -t cgroup2 none /sys/fs/cgroup && exec {sys.executable} {SCRIPT} --nvml {fake_nvml_library()}"
               f" --cuda {fake_cuda_library()} --mps-control {MPS_CONTROL} --workdir {tmp_path / 'work'}"
               f" --out {tmp_path / 'report.json'} --spin-seconds 0.5 --only 3")
    result = subprocess.run(["unshare", "--mount", "sh", "-c", command], capture_output=True, text=True, env=env,
                            timeout=240, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = checks(tmp_path)
    for row in ("3a", "3b", "3c"):
        assert rows[row]["status"] == gc.PASS, rows[row]
        cgroups = rows[row]["numbers"]["cgroups"]
        assert [c["env"] for c in cgroups] == [{gc.ENV_MEMORY_REQUEST: "1024", gc.ENV_MEMORY_LIMIT: "2048"},
                                               {gc.ENV_MEMORY_REQUEST: "2048", gc.ENV_MEMORY_LIMIT: "4096"}]
        assert [(c["read_back"]["soft"], c["read_back"]["hard"]) for c in cgroups] == [
            (1024 * gc.MIB, 2048 * gc.MIB), (2048 * gc.MIB, 4096 * gc.MIB)]
        assert [c["probe"]["allocated_mib"] for c in rows[row]["numbers"]["clients"]] == [2048, 4096]
    # afterwards: every leaf's limit cleared (soft 0, hard max) before its cgroup was removed, and none is left
    limits = (tmp_path / "memory-limits").read_text().splitlines()
    leaves = {line.split()[2] for line in limits}
    assert len(leaves) == 6 and all(f"{gc.NVML_DEVICE_MEMORY_LIMIT_MAX} 0 {leaf}" in limits for leaf in leaves)
    assert "could not remove cgroup" not in result.stdout
    assert set(cgroup2_entries()) == before


def test_checks_past_the_time_budget_are_skipped_and_the_daemons_still_stop(tmp_path: Path) -> None:
    result = run_check(tmp_path, "--budget", "1", cuda=True)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = checks(tmp_path)
    skipped = {r for r, c in rows.items() if c["status"] == gc.SKIPPED and "time budget" in c["details"]}
    assert skipped == {"2a", "2b", "3a", "3b", "3c", "4a", "4b", "4c", "5a", "5b", "6a", "6b", "8a", "8b", "8c"}
    assert rows["1"]["status"] == rows["7"]["status"] == gc.PASS


# ---- 8: the runtime checks' pods are what gpufrac's plugin decides on ----


def test_the_runtime_checks_pods_are_what_the_plugin_injects_and_voids() -> None:
    """8a's pod is a bound fraction as the webhook and the scheduler leave it (its GPU named by the device plugin's
    CDI name): gpufrac's own NRI decision hands it exactly that CDI device. 8b's plain pod asks for every GPU by env:
    the decision voids it. So a FAIL on a node is the node's, not a pod the plugin never meant to serve."""
    uuid = "GPU-11111111-2222-3333-4444-555555555555"
    devices = f"{gc.DEVICE_PLUGIN_CDI_KIND}={uuid}"
    annotations = gc.fraction_annotations(gc.FRACTION_CONTAINER, gc.SM_SHARING, 1024, 2048, devices)
    assert annotations == contract.write_canonical([contract.CanonicalFraction(
        gc.FRACTION_CONTAINER, ComputeMode.SM_SHARING, 1024, 2048, {0: 2048}, (devices,))])
    pipe_dir = str(contract.mps_pipe_dir(DEFAULT_MPS_ROOT, ComputeMode.SM_SHARING))
    env = gc.fraction_env(1024, 2048, pipe_dir, devices)
    resolved = {}  # the webhook's env as the kubelet resolves it against these annotations ("" when one is absent)
    for var in injected_env(gc.FRACTION_CONTAINER, ComputeMode.SM_SHARING, Policy()):
        field = var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
        key = field.removeprefix("metadata.annotations['").removesuffix("']")
        resolved[var["name"]] = var["value"] if "value" in var else annotations.get(key, "")
    assert {name: value for name, value in resolved.items() if value} == env
    assert gc.DEVICE_PLUGIN_CDI_KIND == gpu_devices.DEVICE_PLUGIN_KIND
    assert (gc.CANONICAL_PREFIX, gc.NVIDIA_PREFIX) == (CANONICAL_PREFIX, NVIDIA_PREFIX)
    facts = NodeFacts(gpus=(GpuInfo(0, uuid, "NVIDIA H200", 143771 << 20),), cdi_devices=frozenset({devices}),
                      not_served=dict.fromkeys(ComputeMode))
    pod = PodInfo("gpufrac-gpu-check", "gpu-check-cdi", "u1", annotations)
    fraction = decide(pod, ContainerInfo("c1", gc.FRACTION_CONTAINER, env), facts)
    assert isinstance(fraction, Injection) and fraction.outcome is Outcome.INJECTED, fraction
    assert fraction.cdi_devices == (devices,)
    plain = decide(PodInfo("gpufrac-gpu-check", "gpu-check-plain", "u2", {}),
                   ContainerInfo("c2", "plain", {"NVIDIA_VISIBLE_DEVICES": "all"}), facts)
    assert isinstance(plain, Injection) and plain.outcome is Outcome.VOIDED and not plain.cdi_devices


@pytest.mark.parametrize(("seen", "expected", "status"), [
    (["nvidia-uvm", "nvidia1", "nvidiactl"], "nvidia1", gc.PASS),
    (["nvidia1"], "nvidia1", gc.PASS),
    (["nvidia0", "nvidia1", "nvidiactl"], "nvidia1", gc.FAIL),
    (["nvidiactl"], "nvidia1", gc.FAIL),
    ([], None, gc.PASS),
    (["nvidia-uvm", "nvidiactl"], None, gc.PASS),
    (["nvidia3"], None, gc.FAIL),
])
def test_judge_devices(seen: list[str], expected: str | None, status: str) -> None:
    assert gc.judge_devices(seen, expected)[0] == status


def test_judge_container_limits() -> None:
    mib = gc.MIB
    assert gc.judge_container_limits({"soft": 1024 * mib, "hard": 2048 * mib}, 1024, 2048)[0] == gc.PASS
    status, text = gc.judge_container_limits({"soft": 0, "hard": gc.NVML_DEVICE_MEMORY_LIMIT_MAX}, 1024, 2048)
    assert status == gc.FAIL and "hook did not run" in text
    status, text = gc.judge_container_limits({"soft": 2048 * mib, "hard": 2048 * mib}, 1024, 2048)
    assert status == gc.FAIL and "2048 MiB soft" in text


def test_without_crictl_or_an_image_the_runtime_checks_say_why_they_are_skipped(tmp_path: Path) -> None:
    no_crictl = run_check(tmp_path / "a", "--only", "8", "--crictl", str(tmp_path / "no-crictl"), "--image", "x")
    assert no_crictl.returncode == 0, no_crictl.stdout + no_crictl.stderr
    rows = checks(tmp_path / "a")
    assert rows["8a"]["status"] == rows["8b"]["status"] == gc.SKIPPED
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


def test_the_runtime_checks_default_to_gpufracs_image_on_the_node() -> None:
    listed = {"images": [{"id": "sha256:1", "repoTags": ["registry.k8s.io/pause:3.10"]},
                         {"id": "sha256:2", "repoTags": None},
                         {"id": "sha256:3", "repoTags": ["ghcr.io/acme/gpufrac-stub:1", "ghcr.io/acme/gpufrac:0.4.1"]}]}
    assert gc.gpufrac_image(listed) == "ghcr.io/acme/gpufrac:0.4.1"
    assert gc.gpufrac_image({"images": listed["images"][:2]}) is None
    assert gc.gpufrac_image({}) is None
