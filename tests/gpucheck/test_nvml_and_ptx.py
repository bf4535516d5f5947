"""What gpucheck hands the driver: its NVML structs equal NVIDIA's own (nvidia-ml-py), its NVML wrapper reads the fake
NVML right, and its PTX kernel is well formed for every target it may load."""

from __future__ import annotations

import ctypes
import json
import re
import time
from pathlib import Path

import pynvml
import pytest

from gpucheck import nvml, ptx
from gpucheck.contract import MIB
from testkit.fakes.build import fake_nvml_library

# ---- the ctypes layouts equal NVIDIA's own nvidia-ml-py ----


@pytest.mark.parametrize(("ours", "theirs"), [
    (nvml.NvmlMemory, pynvml.c_nvmlMemory_t),
    (nvml.NvmlProcessInfo, pynvml.c_nvmlProcessInfo_v3_t),  # what ..._GetComputeRunningProcesses_v3 fills
    (nvml.NvmlProcessUtilizationSample, pynvml.c_nvmlProcessUtilizationSample_t),
    (nvml.NvmlSetMemoryLimits, pynvml.c_nvmlSetMemoryLimits_v1_t),
    (nvml.NvmlGetMemoryLimits, pynvml.c_nvmlGetMemoryLimits_v1_t),
])
def test_nvml_structs_match_nvidia_ml_py(ours: type[ctypes.Structure], theirs: type[ctypes.Structure]) -> None:
    assert [(n, ctypes.sizeof(t)) for n, t in ours._fields_] == [(n, ctypes.sizeof(t)) for n, t in theirs._fields_]
    assert ctypes.sizeof(ours) == ctypes.sizeof(theirs)
    for name, _ in ours._fields_:
        assert getattr(ours, name).offset == getattr(theirs, name).offset


def test_nvml_struct_sizes_on_x86_64() -> None:
    sizes = {nvml.NvmlMemory: 24, nvml.NvmlProcessInfo: 24, nvml.NvmlProcessUtilizationSample: 32,
             nvml.NvmlSetMemoryLimits: 24, nvml.NvmlGetMemoryLimits: 32}
    assert {s: ctypes.sizeof(s) for s in sizes} == sizes
    assert nvml.NVML_DEVICE_MEMORY_LIMIT_MAX == pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX
    assert nvml.COMPUTE_MODES[3] == "Exclusive_Process" and pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS == 3


def test_nvml_wrapper_reads_the_fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "nvml.json"
    state.write_text(json.dumps({"driver_version": "615.20", "cuda_driver_version": 13040, "gpus": [
        {"uuid": "GPU-a", "name": "NVIDIA H200", "memory_total_mib": 1000, "compute_mode": 3,
         "processes": [{"pid": 11, "used_memory_mib": 300, "sm_util": 40}, {"pid": 12, "used_memory_mib": 5}]}]}))
    monkeypatch.setenv("GPUFRAC_FAKE_NVML", str(state))
    lib = nvml.Nvml(str(fake_nvml_library()))
    lib.init()
    handle = lib.handle(0)
    assert (lib.driver_version(), lib.cuda_driver_version(), lib.device_count()) == ("615.20", 13040, 1)
    assert (lib.uuid(handle), lib.name(handle), lib.memory(handle).total) == ("GPU-a", "NVIDIA H200", 1000 * MIB)
    assert lib.compute_mode(handle) == "Exclusive_Process"
    assert lib.processes(handle) == {11: 300 * MIB, 12: 5 * MIB}
    assert [(pid, sm) for pid, _, sm in lib.utilization(handle, 0)] == [(11, 40)]
    assert lib.utilization(handle, int(time.time() * 1e6) + 10**9) == []  # nothing newer: NOT_FOUND
    lib.set_memory_limits(handle, "/sys/fs/cgroup/x", 1 * MIB, 2 * MIB)
    assert lib.get_memory_limits(handle, "/sys/fs/cgroup/x") == {"soft": MIB, "hard": 2 * MIB, "used": 0}
    assert lib.mig_enabled(handle) is None  # the fake has no nvmlDeviceGetMigMode: optional, not a crash
    lib.shutdown()


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
    assert entry and entry[1] == ptx.KERNEL_NAME
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
    candidates = ptx.ptx_candidates(*cc)
    assert candidates[0] == first
    assert candidates[-1] == ("sm_50", "4.0") and len(set(candidates)) == len(candidates)
    for target, isa in candidates:
        check_ptx(ptx.ptx_source(target, isa))


def test_ptx_check_catches_a_broken_kernel() -> None:
    good = ptx.ptx_source("sm_90", "7.8")
    for broken in (good.replace("%rd8+16", "%rd9+16"), good.replace("$L_loop;", "$L_nowhere;"),
                   good.replace("ret;", "ret"), good.replace(".address_size 64", ".address_size 32")):
        with pytest.raises(AssertionError):
            check_ptx(broken)
