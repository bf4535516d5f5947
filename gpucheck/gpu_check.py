#!/usr/bin/env python3
"""gpufrac's hardware check: proves on a real GPU node, in under ten minutes, what gpufrac promises.

Copy this one file to a GPU node and run `python3 gpu_check.py` as root (or `bash gpucheck/gpu_check.sh` from a
checkout). It needs only python3 (3.8+) and its standard library, and the NVIDIA driver: the CUDA driver API
(libcuda.so.1) and NVML (libnvidia-ml.so.1) through ctypes, and a tiny kernel given to the driver as PTX text,
so nothing is compiled or installed. It starts its own MPS control daemons (one per compute mode, in the
directory layout gpufrac's agent uses, under a scratch directory), runs CUDA clients as subprocesses of itself
(`gpu_check.py --client ...`, each with its own context and environment), and stops the daemons at the end
whatever happens. It prints one table (PASS / FAIL / SKIPPED with the reason and the numbers) and writes it,
with the raw numbers, to --out (JSON) and --out's .txt twin. Exit status: 0 only when no check FAILed.

Checks (docs/gpu-check.md says how to read them):
  1   inventory: GPUs, memory, driver, MPS control binary, whether the driver has the CUDA 13.4 memory limits
  2x  MPS pinned limit: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, as gpufrac formats it, holds two clients to their limits
  3x  CUDA 13.4 limits: NVIDIA_GPU_MEMORY_REQUEST/LIMIT applied to a cgroup as the toolkit hook does, held
  4x  compute modes: two spinning clients finish together under sm-sharing, take turns without MPS
  5x  pods: sm-sharing clients in their own mount/IPC/PID namespaces, seeing only the delivered directories
  6x  attribution: NVML's per-process memory and utilization name the client processes, not the MPS server
  7   the MPS daemons started, and stopped on `quit`
  8x  the runtime (crictl, containerd 2 with NRI and CDI, gpufrac's NRI plugin): a fraction named by its CDI device sees
      exactly its GPU and gets the CUDA 13.4 limits on its cgroup; a plain pod asking for every GPU by env sees none
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

SCRIPT = os.path.abspath(__file__)
PASS, FAIL, SKIPPED = "PASS", "FAIL", "SKIPPED"
MIB = 1024 * 1024

# ---------------------------------------------------------------------------------------------------------------
# gpufrac's contract, restated. This file runs on a bare GPU node and imports nothing of gpufrac;
# tests/test_gpu_check.py asserts that every value here equals gpufrac's own.
# ---------------------------------------------------------------------------------------------------------------

TIME_SLICING, SM_SHARING = "time-slicing", "sm-sharing"
MODES = (TIME_SLICING, SM_SHARING)  # gpufrac.core.annotations.ComputeMode
GPUFRAC_MPS_ROOT = "/run/gpufrac/mps"  # contract.DEFAULT_MPS_ROOT: pipe directories <root>/<mode> (mps_pipe_dir)
GPUFRAC_MPS_LOG_ROOT = "/var/log/gpufrac/mps"  # AgentConfig.mps_log_root: <log root>/<mode>
GPUFRAC_MPS_CONFIG_DIR = "/run/gpufrac/mps-config"  # AgentConfig.mps_config_dir: <dir>/<mode>.toml
ENV_PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"  # contract.LimitEnv
ENV_LOG_DIRECTORY = "CUDA_MPS_LOG_DIRECTORY"
ENV_PINNED_MEM_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_MEMORY_REQUEST = "NVIDIA_GPU_MEMORY_REQUEST"
ENV_MEMORY_LIMIT = "NVIDIA_GPU_MEMORY_LIMIT"
CANONICAL_PREFIX = "gpufrac.io/container."  # gpufrac.core.annotations: the webhook's annotations per container
NVIDIA_PREFIX = "nvidia.com/container."  # the scheduler's (KAI's): <prefix><container>.gpus.devices
DEVICE_PLUGIN_CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"  # NVIDIA's device plugin's CDI kind; its devices: UUIDs
FRACTION_CONTAINER = "app"  # the runtime checks' fractional container
# CUDA 13.4 memory limits need driver r615+ and a CUDA driver API of 13.4 (13040) or later (agent.capabilities).
MIN_DRIVER_MAJOR = 615
MIN_CUDA_DRIVER_VERSION = 13040


def format_pinned_mem_limit(limit_mib: int, num_devices: int) -> str:
    """CUDA_MPS_PINNED_DEVICE_MEM_LIMIT as the webhook writes it (contract.format_pinned_mem_limit):
    `0=<limit>M,1=<limit>M,...`."""
    return ",".join(f"{index}={limit_mib}M" for index in range(num_devices))


def memory_env_value(mib: int) -> str:
    """NVIDIA_GPU_MEMORY_REQUEST / _LIMIT as the webhook writes them: an integer number of MiB."""
    return str(mib)


def fraction_annotations(container: str, mode: str, request_mib: int, limit_mib: int, devices: str) -> dict[str, str]:
    """A bound fraction's pod annotations: gpufrac's canonical ones as the webhook writes them (one GPU), and the
    GPU the scheduler bound (contract.write_canonical)."""
    ours = f"{CANONICAL_PREFIX}{container}."
    annotations = {f"{ours}compute-mode": mode, f"{ours}gpu-memory.request-mib": str(request_mib),
                   f"{ours}gpu-memory.limit-mib": str(limit_mib)}
    if mode == SM_SHARING:
        annotations[f"{ours}mps-pinned-mem-limit"] = format_pinned_mem_limit(limit_mib, 1)
    annotations[f"{NVIDIA_PREFIX}{container}.gpus.devices"] = devices
    return annotations


def fraction_env(request_mib: int, limit_mib: int, pipe_dir: str, devices: str) -> dict[str, str]:
    """An sm-sharing fraction's env as the kubelet resolves what the webhook injected (mutation.injected_env)."""
    return {"NVIDIA_VISIBLE_DEVICES": devices, ENV_MEMORY_REQUEST: memory_env_value(request_mib),
            ENV_MEMORY_LIMIT: memory_env_value(limit_mib), ENV_PINNED_MEM_LIMIT: format_pinned_mem_limit(limit_mib, 1),
            ENV_PIPE_DIRECTORY: pipe_dir}


def driver_major(version: str) -> int | None:
    digits = ""
    for char in version.strip():
        if not char.isdigit():
            break
        digits += char
    return int(digits) if digits else None


def has_driver_memory_limits(driver_version: str, cuda_driver_version: int) -> bool:
    major = driver_major(driver_version)
    return major is not None and major >= MIN_DRIVER_MAJOR and cuda_driver_version >= MIN_CUDA_DRIVER_VERSION


def modes_to_serve(driver_limits: bool) -> tuple[str, ...]:
    """The modes that get a daemon: without driver limits only sm-sharing (a legacy MPS server shares one context
    between its clients, which would silently turn time-slicing into sm-sharing)."""
    return MODES if driver_limits else (SM_SHARING,)


def render_config(mode: str, audit_log: bool = True) -> str:
    """The MPS v3 TOML the agent writes for one mode's daemon."""
    lines = [
        "# written by the gpufrac agent; rewritten at every daemon start",
        "[features.memacct]",
        "enabled = true",
        f"audit_log = {'true' if audit_log else 'false'}",
        "",
        "[features.context-share]",
        f"enabled = {'true' if mode == SM_SHARING else 'false'}",
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class DaemonLayout:
    mode: str
    pipe_dir: str
    log_dir: str
    config_path: str

    @property
    def control_socket(self) -> str:
        return os.path.join(self.pipe_dir, "control")


def daemon_layout(root: str, mode: str) -> DaemonLayout:
    """The agent's layout (mps root, log root, config dir) rooted in this run's scratch directory."""
    return DaemonLayout(
        mode,
        os.path.join(root, "mps", mode),
        os.path.join(root, "log", mode),
        os.path.join(root, "config", f"{mode}.toml"),
    )


def daemon_argv(binary: str, mode: str, mps_v3: bool, config_path: str) -> tuple[str, ...]:
    """`-p 3 [-m] -f -a <config>` on r615+ (MPS v3, `-m`: multi-user for sm-sharing); `-f` on older drivers."""
    if not mps_v3:
        return (binary, "-f")
    argv = [binary, "-p", "3"]
    if mode == SM_SHARING:
        argv.append("-m")
    return (*argv, "-f", "-a", config_path)


def daemon_env(base_env: dict[str, str], layout: DaemonLayout) -> dict[str, str]:
    env = dict(base_env)
    env[ENV_PIPE_DIRECTORY] = layout.pipe_dir
    env[ENV_LOG_DIRECTORY] = layout.log_dir
    return env


# ---------------------------------------------------------------------------------------------------------------
# Judgements: pure functions from measured numbers to a status (unit-tested in tests/test_gpu_check.py).
# ---------------------------------------------------------------------------------------------------------------

HELD_MIN_FRACTION = 0.5  # a client held to its limit allocates at least this share of it (context memory aside)
PROBE_HEADROOM = 1.5  # a probe stops at limit x this (+ 256 MiB): reaching it means the limit did not hold
TOGETHER_MAX_RATIO = 1.35  # two clients "finish together": both done within this x the time one takes alone
TURNS_MIN_RATIO = 1.65  # two clients "take turns": both done only after this x the time one takes alone
CUDA_ERROR_OUT_OF_MEMORY = 2


def probe_max_mib(limit_mib: int) -> int:
    return int(limit_mib * PROBE_HEADROOM) + 256


def judge_probe(limit_mib: int, probe: dict[str, Any]) -> tuple[str, str]:
    """A client that allocated in chunks until the first failure: held to `limit_mib`, or not."""
    allocated = probe.get("allocated_mib", 0)
    stopped = probe.get("stopped_by")
    if stopped == "max" or allocated > limit_mib:
        return FAIL, f"not held: allocated {allocated} MiB with a {limit_mib} MiB limit"
    if stopped != "oom":
        return FAIL, (f"allocation failed after {allocated} MiB with {probe.get('error_name', '?')}, not "
                      f"CUDA_ERROR_OUT_OF_MEMORY (limit {limit_mib} MiB)")
    if allocated < limit_mib * HELD_MIN_FRACTION:
        return FAIL, (f"out of memory after only {allocated} MiB of a {limit_mib} MiB limit (less than "
                      f"{HELD_MIN_FRACTION:.0%})")
    return PASS, f"{allocated}/{limit_mib} MiB then OUT_OF_MEMORY"


def judge_compute(expect: str, solo_s: float, span_s: float) -> tuple[str, str]:
    """expect "together" (sm-sharing) or "turns" (time-slicing): two clients' span against one client's time."""
    ratio = span_s / solo_s if solo_s > 0 else float("inf")
    text = f"both done after {span_s:.2f}s, one alone {solo_s:.2f}s: {ratio:.2f}x"
    if expect == "together":
        ok = ratio <= TOGETHER_MAX_RATIO
        return (PASS if ok else FAIL), text + ("" if ok else f" (together means <= {TOGETHER_MAX_RATIO}x)")
    ok = ratio >= TURNS_MIN_RATIO
    return (PASS if ok else FAIL), text + ("" if ok else f" (taking turns means >= {TURNS_MIN_RATIO}x)")


def judge_devices(seen: list[str], expected: str | None) -> tuple[str, str]:
    """A container's /dev/nvidia* names against the one GPU device it should have (None: no GPU at all)."""
    gpus = sorted(name for name in seen if name[len("nvidia"):].isdigit())
    shown = ", ".join(f"/dev/{g}" for g in gpus) or "no GPU device"
    if expected is None:
        return (PASS, "no GPU device") if not gpus else (FAIL, f"sees {shown}")
    if gpus != [expected]:
        return FAIL, f"sees {shown}, not exactly /dev/{expected}"
    control = sorted(set(seen) - set(gpus))
    return PASS, f"sees exactly /dev/{expected}" + (f" (and {', '.join(control)})" if control else "")


def gpufrac_image(images: dict[str, Any]) -> str | None:
    """gpufrac's own image among those `crictl images -o json` lists (the agent's: it has sh, ls and sleep)."""
    for image in images.get("images") or []:
        for tag in image.get("repoTags") or []:
            if tag.rsplit(":", 1)[0].rsplit("/", 1)[-1] == "gpufrac":
                return str(tag)
    return None


def judge_container_limits(read_back: dict[str, int], request_mib: int, limit_mib: int) -> tuple[str, str]:
    """NVML's CUDA 13.4 limits on a container's cgroup against the env it was given (soft = request, hard = limit)."""
    soft, hard = read_back.get("soft", 0), read_back.get("hard", NVML_DEVICE_MEMORY_LIMIT_MAX)
    if (soft, hard) == (request_mib * MIB, limit_mib * MIB):
        return PASS, f"NVML holds its cgroup to {request_mib} MiB soft, {limit_mib} MiB hard"
    if (soft, hard) == (0, NVML_DEVICE_MEMORY_LIMIT_MAX):
        return FAIL, ("no CUDA 13.4 limit on its cgroup: the CDI device's apply-cuda-memory-limits hook did not run "
                      "(NVIDIA's CDI spec without it, or a toolkit older than 1.20.1)")
    return FAIL, (f"its cgroup's limits are {soft // MIB} MiB soft, {hard // MIB} MiB hard, not {request_mib} and "
                  f"{limit_mib} MiB")


def judge_pod(facts: dict[str, Any], host_ns: dict[str, str], shm_delivered: bool) -> list[str]:
    """What is wrong with a "pod" client's view of the node (empty when it is isolated as a pod would be)."""
    problems = []
    if facts.get("pid") != 1:
        problems.append(f"not in its own PID namespace (pid {facts.get('pid')})")
    for ns in ("ipc", "mnt", "pid"):
        if facts.get("ns", {}).get(ns) == host_ns.get(ns):
            problems.append(f"shares the host's {ns} namespace")
    if not facts.get("control_socket"):
        problems.append("the delivered pipe directory has no control socket")
    for path, hidden in sorted(facts.get("hidden", {}).items()):
        if not hidden:
            problems.append(f"sees {path}")
    if facts.get("shm_marker_visible") != shm_delivered:
        problems.append("sees the daemon's /dev/shm" if not shm_delivered else "does not see the delivered /dev/shm")
    probe = facts.get("control_probe") or {}
    if probe.get("rc") != 0:
        problems.append(f"could not reach the control daemon through the delivered pipe directory "
                        f"(rc {probe.get('rc')}: {probe.get('output', '').strip()[:120]})")
    return problems


# ---------------------------------------------------------------------------------------------------------------
# NVML through ctypes. Layouts from the NVML API reference (docs.nvidia.com/deploy/nvml-api) and nvml.h; the
# test cross-checks each one against NVIDIA's own nvidia-ml-py (pynvml) definitions.
# ---------------------------------------------------------------------------------------------------------------

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_VALUE_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF
NVML_DEVICE_MEMORY_LIMIT_MAX = 0xFFFFFFFFFFFFFFFF  # hardLimit that clears a limit (with softLimit 0)
COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}


class NvmlMemory(ctypes.Structure):
    # nvmlMemory_t, for nvmlDeviceGetMemoryInfo: total, free, used (bytes), in this order.
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class NvmlProcessInfo(ctypes.Structure):
    # nvmlProcessInfo_t as nvmlDeviceGetComputeRunningProcesses_v3 fills it (the v2 layout: pid, usedGpuMemory,
    # gpuInstanceId, computeInstanceId; 24 bytes on x86_64 with the padding after pid).
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class NvmlProcessUtilizationSample(ctypes.Structure):
    # nvmlProcessUtilizationSample_t: pid, timeStamp (CPU time, microseconds), smUtil, memUtil, encUtil, decUtil.
    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong), ("smUtil", ctypes.c_uint),
                ("memUtil", ctypes.c_uint), ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]


class NvmlSetMemoryLimits(ctypes.Structure):
    # nvmlSetMemoryLimits_v1_t (CUDA 13.4 NVML): nameSpace = full path of the cgroup directory, soft and hard
    # limits in bytes. See docs.nvidia.com/deploy/mps/mpsv3-memory-partitioning.html "Using the NVML API".
    _fields_ = [("nameSpace", ctypes.c_char_p), ("softLimit", ctypes.c_ulonglong), ("hardLimit", ctypes.c_ulonglong)]


class NvmlGetMemoryLimits(ctypes.Structure):
    # nvmlGetMemoryLimits_v1_t: nameSpace [in]; softLimit, hardLimit, currentUsed [out], bytes.
    _fields_ = [("nameSpace", ctypes.c_char_p), ("softLimit", ctypes.c_ulonglong), ("hardLimit", ctypes.c_ulonglong),
                ("currentUsed", ctypes.c_ulonglong)]


class NvmlError(Exception):
    def __init__(self, function: str, code: int, text: str) -> None:
        super().__init__(f"{function}: {text} (NVML error {code})")
        self.function = function
        self.code = code


class Nvml:
    """The NVML calls this check makes, with their C signatures. Optional ones are None when the library lacks
    them (an older driver, or the fake)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lib = ctypes.CDLL(path)
        c_uint, c_int, c_char_p, c_void_p = ctypes.c_uint, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p
        p = ctypes.POINTER
        self._declare("nvmlInit_v2", [])  # nvml.h maps nvmlInit to nvmlInit_v2
        self._declare("nvmlShutdown", [])
        self._declare("nvmlSystemGetDriverVersion", [c_char_p, c_uint])  # (char *version, unsigned int length)
        self._declare("nvmlSystemGetCudaDriverVersion_v2", [p(c_int)])
        self._declare("nvmlDeviceGetCount_v2", [p(c_uint)])  # nvmlDeviceGetCount -> _v2
        self._declare("nvmlDeviceGetHandleByIndex_v2", [c_uint, p(c_void_p)])  # (index, nvmlDevice_t *device)
        self._declare("nvmlDeviceGetUUID", [c_void_p, c_char_p, c_uint])
        self._declare("nvmlDeviceGetName", [c_void_p, c_char_p, c_uint])
        self._declare("nvmlDeviceGetMemoryInfo", [c_void_p, p(NvmlMemory)])
        # (device, unsigned int *infoCount, nvmlProcessInfo_t *infos): infoCount in = array size, out = count
        self._declare("nvmlDeviceGetComputeRunningProcesses_v3", [c_void_p, p(c_uint), p(NvmlProcessInfo)])
        # (device, samples, unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp): note that
        # the count pointer comes after the buffer and the timestamp last.
        self._declare("nvmlDeviceGetProcessUtilization",
                      [c_void_p, p(NvmlProcessUtilizationSample), p(c_uint), ctypes.c_ulonglong])
        self._declare("nvmlDeviceGetComputeMode", [c_void_p, p(c_int)], optional=True)
        self._declare("nvmlDeviceGetMigMode", [c_void_p, p(c_uint), p(c_uint)], optional=True)
        self._declare("nvmlDeviceSetMemoryLimits_v1", [c_void_p, p(NvmlSetMemoryLimits)], optional=True)
        self._declare("nvmlDeviceGetMemoryLimits_v1", [c_void_p, p(NvmlGetMemoryLimits)], optional=True)
        self.lib.nvmlErrorString.argtypes = [c_int]
        self.lib.nvmlErrorString.restype = c_char_p

    def _declare(self, name: str, argtypes: list[Any], optional: bool = False) -> None:
        try:
            function = getattr(self.lib, name)
        except AttributeError:
            if not optional:
                raise
            setattr(self, name, None)
            return
        function.argtypes = argtypes
        function.restype = ctypes.c_int  # nvmlReturn_t
        setattr(self, name, function)

    def has(self, name: str) -> bool:
        return getattr(self, name, None) is not None

    def _call(self, name: str, *args: Any) -> int:
        code = getattr(self, name)(*args)
        return int(code)

    def _check(self, name: str, *args: Any) -> None:
        code = self._call(name, *args)
        if code != NVML_SUCCESS:
            raise NvmlError(name, code, self.error_text(code))

    def error_text(self, code: int) -> str:
        text = self.lib.nvmlErrorString(code)
        return text.decode(errors="replace") if text else "unknown error"

    def init(self) -> None:
        self._check("nvmlInit_v2")

    def shutdown(self) -> None:
        self._call("nvmlShutdown")

    def driver_version(self) -> str:
        buf = ctypes.create_string_buffer(96)
        self._check("nvmlSystemGetDriverVersion", buf, len(buf))
        return buf.value.decode(errors="replace").strip()

    def cuda_driver_version(self) -> int:
        value = ctypes.c_int()
        self._check("nvmlSystemGetCudaDriverVersion_v2", ctypes.byref(value))
        return value.value

    def device_count(self) -> int:
        value = ctypes.c_uint()
        self._check("nvmlDeviceGetCount_v2", ctypes.byref(value))
        return value.value

    def handle(self, index: int) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        self._check("nvmlDeviceGetHandleByIndex_v2", index, ctypes.byref(handle))
        return handle

    def _text(self, name: str, handle: ctypes.c_void_p) -> str:
        buf = ctypes.create_string_buffer(96)
        self._check(name, handle, buf, len(buf))
        return buf.value.decode(errors="replace")

    def uuid(self, handle: ctypes.c_void_p) -> str:
        return self._text("nvmlDeviceGetUUID", handle)

    def name(self, handle: ctypes.c_void_p) -> str:
        return self._text("nvmlDeviceGetName", handle)

    def memory(self, handle: ctypes.c_void_p) -> NvmlMemory:
        memory = NvmlMemory()
        self._check("nvmlDeviceGetMemoryInfo", handle, ctypes.byref(memory))
        return memory

    def compute_mode(self, handle: ctypes.c_void_p) -> str | None:
        if not self.has("nvmlDeviceGetComputeMode"):
            return None
        mode = ctypes.c_int()
        if self._call("nvmlDeviceGetComputeMode", handle, ctypes.byref(mode)) != NVML_SUCCESS:
            return None
        return COMPUTE_MODES.get(mode.value, str(mode.value))

    def mig_enabled(self, handle: ctypes.c_void_p) -> bool | None:
        if not self.has("nvmlDeviceGetMigMode"):
            return None
        current, pending = ctypes.c_uint(), ctypes.c_uint()
        code = self._call("nvmlDeviceGetMigMode", handle, ctypes.byref(current), ctypes.byref(pending))
        if code != NVML_SUCCESS:
            return None  # NOT_SUPPORTED on GPUs without MIG
        return bool(current.value)

    def processes(self, handle: ctypes.c_void_p) -> dict[int, int | None]:
        """pid -> used GPU memory in bytes (None where NVML has no number) for every compute process."""
        for _ in range(4):
            count = ctypes.c_uint(0)
            code = self._call("nvmlDeviceGetComputeRunningProcesses_v3", handle, ctypes.byref(count), None)
            if code == NVML_SUCCESS:
                return {}
            if code != NVML_ERROR_INSUFFICIENT_SIZE:
                raise NvmlError("nvmlDeviceGetComputeRunningProcesses_v3", code, self.error_text(code))
            size = count.value + 8  # processes may start between the two calls
            infos = (NvmlProcessInfo * size)()
            count = ctypes.c_uint(size)
            code = self._call("nvmlDeviceGetComputeRunningProcesses_v3", handle, ctypes.byref(count), infos)
            if code == NVML_ERROR_INSUFFICIENT_SIZE:
                continue
            if code != NVML_SUCCESS:
                raise NvmlError("nvmlDeviceGetComputeRunningProcesses_v3", code, self.error_text(code))
            return {int(infos[i].pid): (None if infos[i].usedGpuMemory == NVML_VALUE_NOT_AVAILABLE
                                        else int(infos[i].usedGpuMemory)) for i in range(count.value)}
        raise NvmlError("nvmlDeviceGetComputeRunningProcesses_v3", NVML_ERROR_INSUFFICIENT_SIZE, "kept growing")

    def utilization(self, handle: ctypes.c_void_p, since_us: int) -> list[tuple[int, int, int]]:
        """(pid, timestamp us, smUtil) samples newer than since_us; [] when there are none."""
        count = ctypes.c_uint(0)
        code = self._call("nvmlDeviceGetProcessUtilization", handle, None, ctypes.byref(count), since_us)
        if code == NVML_ERROR_NOT_FOUND:
            return []
        if code not in (NVML_SUCCESS, NVML_ERROR_INSUFFICIENT_SIZE):
            raise NvmlError("nvmlDeviceGetProcessUtilization", code, self.error_text(code))
        size = max(count.value, 1) + 8
        samples = (NvmlProcessUtilizationSample * size)()
        count = ctypes.c_uint(size)
        code = self._call("nvmlDeviceGetProcessUtilization", handle, samples, ctypes.byref(count), since_us)
        if code == NVML_ERROR_NOT_FOUND:
            return []
        if code != NVML_SUCCESS:
            raise NvmlError("nvmlDeviceGetProcessUtilization", code, self.error_text(code))
        return [(int(samples[i].pid), int(samples[i].timeStamp), int(samples[i].smUtil))
                for i in range(count.value)]

    def set_memory_limits(self, handle: ctypes.c_void_p, cgroup: str, soft: int, hard: int) -> None:
        limits = NvmlSetMemoryLimits(cgroup.encode(), soft, hard)
        self._check("nvmlDeviceSetMemoryLimits_v1", handle, ctypes.byref(limits))

    def get_memory_limits(self, handle: ctypes.c_void_p, cgroup: str) -> dict[str, int]:
        limits = NvmlGetMemoryLimits(cgroup.encode(), 0, 0, 0)
        self._check("nvmlDeviceGetMemoryLimits_v1", handle, ctypes.byref(limits))
        return {"soft": limits.softLimit, "hard": limits.hardLimit, "used": limits.currentUsed}


# ---------------------------------------------------------------------------------------------------------------
# The CUDA driver API through ctypes (only in client subprocesses: the parent never creates a context).
# Signatures from the CUDA Driver API reference, docs.nvidia.com/cuda/cuda-driver-api; the _v2 names are the
# symbols cuda.h maps the plain names to (64-bit CUdeviceptr and size_t sizes).
# ---------------------------------------------------------------------------------------------------------------

CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


class CudaError(Exception):
    def __init__(self, function: str, code: int, name: str) -> None:
        super().__init__(f"{function}: {name} ({code})")
        self.function = function
        self.code = code
        self.name = name


class Cuda:
    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path)
        c_uint, c_int, c_void_p, c_size_t = ctypes.c_uint, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t
        c_devptr = ctypes.c_ulonglong  # CUdeviceptr_v2: unsigned long long
        p = ctypes.POINTER
        self._declare("cuInit", [c_uint])  # (unsigned int Flags), Flags must be 0
        self._declare("cuDriverGetVersion", [p(c_int)])
        self._declare("cuDeviceGet", [p(c_int), c_int])  # (CUdevice *device, int ordinal)
        self._declare("cuDeviceGetName", [ctypes.c_char_p, c_int, c_int])  # (char *name, int len, CUdevice dev)
        self._declare("cuDeviceGetAttribute", [p(c_int), c_int, c_int])  # (int *pi, attrib, CUdevice dev)
        self._declare("cuDeviceTotalMem_v2", [p(c_size_t), c_int])  # (size_t *bytes, CUdevice dev)
        # The primary context (cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)) rather than
        # cuCtxCreate, whose ABI changed over versions (_v2, _v3, _v4 with CUctxCreateParams in CUDA 13).
        self._declare("cuDevicePrimaryCtxRetain", [p(c_void_p), c_int])
        self._declare("cuDevicePrimaryCtxRelease_v2", [c_int])
        self._declare("cuCtxSetCurrent", [c_void_p])
        self._declare("cuCtxSynchronize", [])
        self._declare("cuMemGetInfo_v2", [p(c_size_t), p(c_size_t)])  # (size_t *free, size_t *total): free first
        self._declare("cuMemAlloc_v2", [p(c_devptr), c_size_t])  # (CUdeviceptr *dptr, size_t bytesize)
        self._declare("cuMemFree_v2", [c_devptr])
        self._declare("cuMemsetD8_v2", [c_devptr, ctypes.c_ubyte, c_size_t])  # (dst, unsigned char uc, size_t N)
        self._declare("cuMemcpyDtoH_v2", [c_void_p, c_devptr, c_size_t])  # (void *dstHost, src, ByteCount)
        self._declare("cuModuleLoadData", [p(c_void_p), c_void_p])  # (CUmodule *module, const void *image)
        self._declare("cuModuleGetFunction", [p(c_void_p), c_void_p, ctypes.c_char_p])  # (*hfunc, hmod, name)
        # cuLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
        #                hStream, void **kernelParams, void **extra): kernelParams[i] points at parameter i.
        self._declare("cuLaunchKernel", [c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint,
                                         c_void_p, p(c_void_p), p(c_void_p)])
        self.lib.cuGetErrorName.argtypes = [c_int, p(ctypes.c_char_p)]  # (CUresult error, const char **pStr)
        self.lib.cuGetErrorName.restype = c_int

    def _declare(self, name: str, argtypes: list[Any]) -> None:
        function = getattr(self.lib, name)
        function.argtypes = argtypes
        function.restype = ctypes.c_int  # CUresult
        setattr(self, name, function)

    def error_name(self, code: int) -> str:
        text = ctypes.c_char_p()
        if self.lib.cuGetErrorName(code, ctypes.byref(text)) == 0 and text.value:
            return text.value.decode()
        return f"CUresult {code}"

    def call(self, name: str, *args: Any) -> int:
        return int(getattr(self, name)(*args))

    def check(self, name: str, *args: Any) -> None:
        code = self.call(name, *args)
        if code != 0:
            raise CudaError(name, code, self.error_name(code))


# ---------------------------------------------------------------------------------------------------------------
# The kernel, as PTX text for cuModuleLoadData (the driver's JIT compiles it; a NUL-terminated string).
# Every thread runs `iterations` dependent FMAs and stores its result (so nothing can be optimized away); thread 0
# of block 0 also stores %globaltimer (PTX ISA 3.1+, sm_30+: a 64-bit nanosecond timer) before and after.
# Output buffer: [0] start ns (u64), [8] end ns (u64), [16 + 4*i] thread i's result (f32).
# ---------------------------------------------------------------------------------------------------------------

KERNEL_NAME = "gpufrac_spin"
PTX_TEMPLATE = """//
// gpufrac gpu_check: spin for a number of dependent FMA iterations.
//
.version {isa}
.target {target}
.address_size 64

.visible .entry gpufrac_spin(
	.param .u64 gpufrac_spin_out,
	.param .u64 gpufrac_spin_iterations
)
{{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<4>;
	.reg .f32 	%f<2>;
	.reg .b64 	%rd<9>;

	ld.param.u64 	%rd1, [gpufrac_spin_out];
	ld.param.u64 	%rd2, [gpufrac_spin_iterations];
	cvta.to.global.u64 	%rd3, %rd1;
	mov.u64 	%rd4, %globaltimer;
	mov.f32 	%f1, 0f3F800000;
	mov.u64 	%rd5, 0;
	setp.eq.u64 	%p1, %rd2, 0;
	@%p1 bra 	$L_done;
$L_loop:
	fma.rn.f32 	%f1, %f1, 0f3F7FFFEF, 0f3A83126F;
	add.u64 	%rd5, %rd5, 1;
	setp.lt.u64 	%p1, %rd5, %rd2;
	@%p1 bra 	$L_loop;
$L_done:
	mov.u64 	%rd6, %globaltimer;
	mov.u32 	%r1, %tid.x;
	mov.u32 	%r2, %ctaid.x;
	mov.u32 	%r3, %ntid.x;
	mad.lo.u32 	%r3, %r2, %r3, %r1;
	mul.wide.u32 	%rd7, %r3, 4;
	add.u64 	%rd8, %rd3, %rd7;
	st.global.f32 	[%rd8+16], %f1;
	or.b32 	%r1, %r1, %r2;
	setp.ne.u32 	%p2, %r1, 0;
	@%p2 bra 	$L_end;
	st.global.u64 	[%rd3], %rd4;
	st.global.u64 	[%rd3+8], %rd6;
$L_end:
	ret;
}}
"""

# The lowest PTX ISA version each target accepts (PTX ISA "Release notes" table). The device's own target is
# tried first, then sm_75 (the oldest CUDA 13 still targets) and sm_50; the JIT runs PTX on any newer GPU.
PTX_MIN_ISA = {
    "sm_50": "4.0", "sm_52": "4.1", "sm_53": "4.2", "sm_60": "5.0", "sm_61": "5.0", "sm_62": "5.0",
    "sm_70": "6.0", "sm_72": "6.1", "sm_75": "6.3", "sm_80": "7.0", "sm_86": "7.1", "sm_87": "7.4",
    "sm_89": "7.8", "sm_90": "7.8", "sm_100": "8.6", "sm_101": "8.6", "sm_103": "8.8", "sm_120": "8.7",
    "sm_121": "8.8",
}


def ptx_source(target: str, isa: str) -> str:
    return PTX_TEMPLATE.format(target=target, isa=isa)


def ptx_candidates(cc_major: int, cc_minor: int) -> list[tuple[str, str]]:
    own = f"sm_{cc_major}{cc_minor}"
    candidates = [(own, PTX_MIN_ISA[own])] if own in PTX_MIN_ISA else []
    for target in ("sm_75", "sm_50"):
        if (target, PTX_MIN_ISA[target]) not in candidates:
            candidates.append((target, PTX_MIN_ISA[target]))
    return candidates


# ---------------------------------------------------------------------------------------------------------------
# The client: one subprocess per CUDA client, `gpu_check.py --client <json spec>`. It reports JSON lines on
# stdout ({"event": "ready"|"result"|"error"|...}) and waits for words on stdin ("go", "release").
# ---------------------------------------------------------------------------------------------------------------


def emit(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


_stdin_buffer = bytearray()


def wait_word(word: str, timeout: float) -> None:
    """Waits for a line `word` from the parent on stdin (read from the fd: no buffering hides a second word)."""
    deadline = time.monotonic() + timeout
    while True:
        while b"\n" in _stdin_buffer:
            line, _, rest = bytes(_stdin_buffer).partition(b"\n")
            _stdin_buffer[:] = rest
            if line.strip().decode(errors="replace") == word:
                return
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no {word!r} from the parent within {timeout:.0f}s")
        ready, _, _ = select.select([0], [], [], left)
        if ready:
            chunk = os.read(0, 4096)
            if not chunk:
                raise EOFError("the parent closed stdin")
            _stdin_buffer.extend(chunk)


MS_NOSUID, MS_NODEV, MS_BIND = 2, 4, 4096


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    # int mount(const char *source, const char *target, const char *filesystemtype, unsigned long mountflags,
    #           const void *data) -- mount(2)
    if libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                  data.encode() if data else None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def enter_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """Inside `unshare --mount --ipc --pid --fork --mount-proc`: make this mount namespace look like a pod's. Hide
    the node's MPS directories (tmpfs over them), then bind back only what gpufrac delivers: the mode's pipe
    directory at the same path, and, when delivered, the daemon's /dev/shm (else a private tmpfs /dev/shm)."""
    kept = {d["source"]: os.open(d["source"], os.O_PATH | os.O_DIRECTORY) for d in pod["deliver"]}
    for path in pod["hide"]:
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
    for delivered in pod["deliver"]:
        os.makedirs(delivered["target"], exist_ok=True)
        _mount(f"/proc/self/fd/{kept[delivered['source']]}", delivered["target"], None, MS_BIND, None)
    if not pod["shm_delivered"]:
        _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for fd in kept.values():
        os.close(fd)
    pipe = pod["pipe_dir"]
    facts: dict[str, Any] = {
        "pid": os.getpid(),
        "ns": {ns: os.readlink(f"/proc/self/ns/{ns}") for ns in ("ipc", "mnt", "pid")},
        "control_socket": is_socket(os.path.join(pipe, "control")),
        "hidden": {path: not os.path.exists(path) for path in pod["expect_hidden"]},
        "shm_marker_visible": os.path.exists(pod["shm_marker"]),
    }
    try:
        probe = subprocess.run([pod["mps_control"]], input="get_server_list\n", capture_output=True, text=True,
                               timeout=15, env={**os.environ, ENV_PIPE_DIRECTORY: pipe}, check=False)
        facts["control_probe"] = {"rc": probe.returncode, "output": (probe.stdout + probe.stderr)[-300:]}
    except (OSError, subprocess.TimeoutExpired) as err:
        facts["control_probe"] = {"rc": None, "output": str(err)}
    return facts


def join_cgroup(path: str) -> None:
    with open(os.path.join(path, "cgroup.procs"), "w") as procs:
        procs.write(str(os.getpid()))


class Kernel:
    """The loaded module, and launches of its spin kernel with an output buffer sized for the grid."""

    def __init__(self, cuda: Cuda, cc: tuple[int, int]) -> None:
        self.cuda = cuda
        self.module = ctypes.c_void_p()
        errors = []
        for target, isa in ptx_candidates(*cc):
            image = ctypes.create_string_buffer(ptx_source(target, isa).encode())  # NUL-terminated PTX
            code = cuda.call("cuModuleLoadData", ctypes.byref(self.module), image)
            if code == 0:
                self.target = f"{target} (PTX ISA {isa})"
                break
            errors.append(f"{target}/{isa}: {cuda.error_name(code)}")
        else:
            raise CudaError("cuModuleLoadData", -1, "; ".join(errors))
        self.function = ctypes.c_void_p()
        cuda.check("cuModuleGetFunction", ctypes.byref(self.function), self.module, KERNEL_NAME.encode())

    def launch(self, iterations: int, blocks: int, threads: int) -> tuple[int, ctypes.c_ulonglong]:
        """Starts the kernel (asynchronous); returns (output bytes, device buffer) for `result`."""
        size = 16 + 4 * blocks * threads
        out = ctypes.c_ulonglong()
        self.cuda.check("cuMemAlloc_v2", ctypes.byref(out), size)
        out_arg, iterations_arg = ctypes.c_ulonglong(out.value), ctypes.c_ulonglong(iterations)
        params = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.byref(out_arg), ctypes.c_void_p),
                                       ctypes.cast(ctypes.byref(iterations_arg), ctypes.c_void_p))
        self.cuda.check("cuLaunchKernel", self.function, blocks, 1, 1, threads, 1, 1, 0, None, params, None)
        return size, out

    def result(self, out: ctypes.c_ulonglong) -> tuple[int, int]:
        """Waits for the kernel; returns its (start, end) %globaltimer in ns and frees the buffer."""
        self.cuda.check("cuCtxSynchronize")
        times = (ctypes.c_ulonglong * 2)()
        self.cuda.check("cuMemcpyDtoH_v2", times, out, 16)
        self.cuda.check("cuMemFree_v2", out)
        return int(times[0]), int(times[1])

    def run(self, iterations: int, blocks: int = 1, threads: int = 32) -> dict[str, float]:
        started = time.time()
        _, out = self.launch(iterations, blocks, threads)
        start_ns, end_ns = self.result(out)
        done = time.time()
        return {"host_start": started, "host_end": done, "host_s": done - started,
                "gpu_s": (end_ns - start_ns) / 1e9}


MAX_ITERATIONS = 1 << 40


def calibrate(kernel: Kernel, target_s: float) -> dict[str, Any]:
    """Iterations for one single-block kernel to run `target_s`, and the time it then takes alone."""
    iterations = 1 << 20
    for _ in range(12):
        timing = kernel.run(iterations)
        seconds = timing["gpu_s"] if timing["gpu_s"] > 0 else timing["host_s"]  # a %globaltimer that reads 0
        if seconds >= 0.2 or iterations >= MAX_ITERATIONS:
            break
        iterations = min(MAX_ITERATIONS, iterations * int(min(16, max(2, 0.3 / max(seconds, 1e-6)))))
    iterations = max(1, min(MAX_ITERATIONS, int(iterations * target_s / max(seconds, 1e-6))))
    solo = kernel.run(iterations)
    return {"iterations": iterations, "solo_s": solo["host_s"], "solo_gpu_s": solo["gpu_s"]}


def alloc_probe(cuda: Cuda, max_mib: int, chunk_mib: int = 64, fine_mib: int = 4) -> dict[str, Any]:
    """Allocates (and touches) chunks until the first failure, then smaller chunks up to the edge; keeps them."""
    chunks: list[int] = []
    allocated = 0
    failed: int | None = None  # the CUresult that ended the last phase; None: it reached max_mib
    for size in (chunk_mib, fine_mib):
        failed = None
        while allocated + size <= max_mib:
            ptr = ctypes.c_ulonglong()
            code = cuda.call("cuMemAlloc_v2", ctypes.byref(ptr), size * MIB)
            if code != 0:
                failed = code
                break
            cuda.check("cuMemsetD8_v2", ptr, 0x5A, size * MIB)
            chunks.append(ptr.value)
            allocated += size
        if failed is not None and failed != CUDA_ERROR_OUT_OF_MEMORY:
            break
    cuda.check("cuCtxSynchronize")
    stopped_by = "max" if failed is None else "oom" if failed == CUDA_ERROR_OUT_OF_MEMORY else "error"
    return {"allocated_mib": allocated, "stopped_by": stopped_by, "chunks": chunks,
            "error_name": None if failed is None else cuda.error_name(failed), "error_code": failed}


def alloc_fixed(cuda: Cuda, mib: int) -> list[int]:
    ptr = ctypes.c_ulonglong()
    cuda.check("cuMemAlloc_v2", ctypes.byref(ptr), mib * MIB)
    cuda.check("cuMemsetD8_v2", ptr, 0x5A, mib * MIB)
    return [ptr.value]


def mem_info(cuda: Cuda) -> dict[str, int]:
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    cuda.check("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
    return {"free_mib": free.value // MIB, "total_mib": total.value // MIB}


def client_main(spec: dict[str, Any]) -> int:
    stage = ["start"]  # the step in progress, named in the error event
    try:
        if spec.get("pod"):
            stage[0] = "pod"
            emit(event="pod", facts=enter_pod(spec["pod"]))
        if spec.get("cgroup"):
            stage[0] = "cgroup"
            join_cgroup(spec["cgroup"])
        if not spec.get("cuda"):
            emit(event="result", cuda=False)
            return 0
        cuda_client(spec, stage)
        return 0
    except CudaError as err:
        emit(event="error", stage=stage[0], error=str(err), error_name=err.name, code=err.code)
    except (OSError, TimeoutError, EOFError, ValueError, KeyError) as err:
        emit(event="error", stage=stage[0], error=f"{type(err).__name__}: {err}")
    return 1


def cuda_client(spec: dict[str, Any], stage: list[str]) -> None:
    """A CUDA client: its context (through MPS when its pipe directory has a daemon), `ready`, then on `go` the
    work its spec names (calibrate, probe, allocate, spin), `result`, and with `hold` it keeps its memory until
    `release`."""
    stage[0] = "cuInit"
    cuda = Cuda(spec["cuda"])
    cuda.check("cuInit", 0)
    device = ctypes.c_int()
    cuda.check("cuDeviceGet", ctypes.byref(device), 0)
    stage[0] = "context"
    ctx = ctypes.c_void_p()
    cuda.check("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), device)  # connects to MPS, if any
    cuda.check("cuCtxSetCurrent", ctx)
    info = describe_device(cuda, device)
    stage[0] = "module"
    kernel = Kernel(cuda, (info["cc_major"], info["cc_minor"]))
    info["ptx_target"] = kernel.target
    info["mem"] = mem_info(cuda)
    emit(event="ready", pid=os.getpid(), **info)
    if spec.get("action") == "info":
        emit(event="result")
        return
    stage[0] = "go"
    wait_word("go", spec.get("go_timeout", 120))
    stage[0] = "work"
    emit(event="result", **client_work(spec, cuda, kernel))
    if spec.get("hold"):
        stage[0] = "hold"
        wait_word("release", spec.get("hold_timeout", 120))
    cuda.call("cuDevicePrimaryCtxRelease_v2", device)


def client_work(spec: dict[str, Any], cuda: Cuda, kernel: Kernel) -> dict[str, Any]:
    result: dict[str, Any] = {"t_go": time.time()}
    if spec.get("action") == "calibrate":
        result.update(calibrate(kernel, spec["target_s"]))
    if "probe_max_mib" in spec:
        result["probe"] = alloc_probe(cuda, spec["probe_max_mib"])
        result["mem_after"] = mem_info(cuda)
    if "alloc_mib" in spec:
        alloc_fixed(cuda, spec["alloc_mib"])
        emit(event="allocated", mib=spec["alloc_mib"])
    if "spin_iterations" in spec:
        result["spin"] = kernel.run(spec["spin_iterations"], spec.get("blocks", 1), spec.get("threads", 32))
    result["t_done"] = time.time()
    return result


def describe_device(cuda: Cuda, device: ctypes.c_int) -> dict[str, Any]:
    def attribute(attr: int) -> int:
        value = ctypes.c_int()
        cuda.check("cuDeviceGetAttribute", ctypes.byref(value), attr, device)
        return value.value

    name = ctypes.create_string_buffer(256)
    cuda.check("cuDeviceGetName", name, len(name), device)
    total = ctypes.c_size_t()
    cuda.check("cuDeviceTotalMem_v2", ctypes.byref(total), device)
    version = ctypes.c_int()
    cuda.check("cuDriverGetVersion", ctypes.byref(version))
    return {"name": name.value.decode(errors="replace"), "total_mib": total.value // MIB,
            "cuda_driver_version": version.value,
            "cc_major": attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            "cc_minor": attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
            "sm_count": attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)}


# ---------------------------------------------------------------------------------------------------------------
# The parent: processes it runs (clients, daemons) and how it ends them.
# ---------------------------------------------------------------------------------------------------------------


def is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def kill_group(proc: subprocess.Popen[Any], sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class ClientError(Exception):
    """A client exited, timed out or reported an error before the event the check waited for."""

    def __init__(self, name: str, text: str, event: dict[str, Any] | None = None) -> None:
        super().__init__(f"{name}: {text}")
        self.event = event or {}


class Client:
    """One client subprocess, its JSON events read by a thread."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], stderr_path: str) -> None:
        self.name = name
        self.stderr_path = stderr_path
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._eof = False
        with open(stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=stderr, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                event = json.loads(raw.decode(errors="replace"))
            except ValueError:
                continue
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def stderr_tail(self) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                return f.read()[-400:].decode(errors="replace").strip()
        except OSError:
            return ""

    def wait(self, kind: str, timeout: float) -> dict[str, Any]:
        """The first `kind` event; ClientError on an error event, exit or timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self.events:
                    if event.get("event") == kind:
                        return event
                    if event.get("event") == "error":
                        raise ClientError(self.name, f"{event.get('stage')}: {event.get('error')}", event)
                if self._eof:
                    raise ClientError(self.name, f"exited ({self.proc.poll()}) before {kind}: "
                                                  f"{self.stderr_tail() or 'no output'}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ClientError(self.name, f"no {kind} within {timeout:.0f}s")
                self._cond.wait(left)

    def send(self, word: str) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(word.encode() + b"\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass

    def close(self, timeout: float = 15.0) -> int | None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
            return self.proc.wait()


@dataclass
class Daemon:
    """One MPS control daemon, run in the foreground (`-f`) as the agent runs it."""

    binary: str
    layout: DaemonLayout
    mps_v3: bool
    base_env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    started: dict[str, Any] = field(default_factory=dict)
    stopped: dict[str, Any] = field(default_factory=dict)

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and is_socket(self.layout.control_socket)

    def start(self, timeout: float = 20.0) -> dict[str, Any]:
        lay = self.layout
        for path in (lay.pipe_dir, lay.log_dir, os.path.dirname(lay.config_path)):
            os.makedirs(path, exist_ok=True)
        os.chmod(lay.pipe_dir, 0o755)  # clients of any UID must reach the socket (as the agent does)
        if self.mps_v3:
            with open(lay.config_path, "w") as config:
                config.write(render_config(lay.mode))
            os.chmod(lay.config_path, 0o644)
        argv = daemon_argv(self.binary, lay.mode, self.mps_v3, lay.config_path)
        began = time.monotonic()
        with open(os.path.join(lay.log_dir, "daemon-stdio.log"), "ab") as stdio:
            self.proc = subprocess.Popen(list(argv), env=daemon_env(self.base_env, lay), stdin=subprocess.PIPE,
                                         stdout=stdio, stderr=subprocess.STDOUT, start_new_session=True)
        while time.monotonic() - began < timeout and self.proc.poll() is None and not self.up:
            time.sleep(0.05)
        self.started = {"argv": list(argv), "pid": self.proc.pid, "up": self.up,
                        "seconds": round(time.monotonic() - began, 2), "exit": self.proc.poll()}
        if not self.up:
            self.started["log"] = tail(os.path.join(lay.log_dir, "control.log")) or tail(
                os.path.join(lay.log_dir, "daemon-stdio.log"))
        return self.started

    def stop(self, quit_timeout: float) -> dict[str, Any]:
        """`echo quit | nvidia-cuda-mps-control` with the daemon's env, then `quit` on its stdin, then SIGKILL to
        its process group and to any MPS server of its pipe directory left behind."""
        if self.proc is None or self.stopped:
            return self.stopped
        how = "already exited"
        began = time.monotonic()
        if self.proc.poll() is None:
            how = "quit"
            try:
                subprocess.run([self.binary], input=b"quit\n", env=daemon_env(self.base_env, self.layout),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                               timeout=max(quit_timeout, 15.0))  # the client returns once it has sent quit
            except (OSError, subprocess.TimeoutExpired):
                pass
            if not wait_exit(self.proc, quit_timeout):
                how = "quit on stdin"
                try:
                    assert self.proc.stdin is not None
                    self.proc.stdin.write(b"quit\n")
                    self.proc.stdin.flush()
                except (OSError, ValueError):
                    pass
                if not wait_exit(self.proc, min(5.0, quit_timeout)):
                    how = "killed (ignored quit)"
                    kill_group(self.proc)
                    self.proc.wait()
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        strays = kill_mps_processes(self.layout.pipe_dir)
        self.stopped = {"how": how, "exit": self.proc.returncode, "seconds": round(time.monotonic() - began, 2),
                        "strays_killed": strays}
        return self.stopped


def wait_exit(proc: subprocess.Popen[Any], timeout: float) -> bool:
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def tail(path: str, size: int = 400) -> str:
    try:
        with open(path, "rb") as f:
            return f.read()[-size:].decode(errors="replace").strip()
    except OSError:
        return ""


def mps_processes(pipe_dir: str) -> list[int]:
    """PIDs of nvidia-cuda-mps-* processes (control daemons, servers) whose environment names pipe_dir."""
    wanted = f"{ENV_PIPE_DIRECTORY}={pipe_dir}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0")[0]
            if not os.path.basename(argv0).startswith(b"nvidia-cuda-mps"):
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if wanted in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def mps_server_pids(pipe_dirs: list[str]) -> list[int]:
    pids = []
    for pipe_dir in pipe_dirs:
        for pid in mps_processes(pipe_dir):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"mps-server" in f.read().split(b"\0")[0]:
                        pids.append(pid)
            except OSError:
                continue
    return pids


def kill_mps_processes(pipe_dir: str) -> list[int]:
    killed = []
    for pid in mps_processes(pipe_dir):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (ProcessLookupError, PermissionError):
            continue
    return killed


# ---------------------------------------------------------------------------------------------------------------
# The checks: the session they share, the node's facts, the daemons, then one class per group of checks.
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Row:
    id: str
    name: str
    status: str
    details: str
    numbers: dict[str, Any] = field(default_factory=dict)


class InterruptedRun(Exception):  # noqa: N818 -- a signal, not an error
    pass


@dataclass
class Node:
    """What the inventory (check 1) found and the CUDA setup measured: what every other check runs on."""

    nvml: Nvml | None = None
    handle: ctypes.c_void_p | None = None
    gpu_uuid: str | None = None
    gpu_total_mib: int = 0
    compute_mode: str | None = None
    driver_limits: bool = False
    served: tuple[str, ...] = ()
    mps_control: str | None = None
    cuda_path: str | None = None
    cuda_reason: str = ""  # why there is no CUDA, in full (the inventory) and short (the other rows)
    cuda_short: str = ""
    device: dict[str, Any] = field(default_factory=dict)
    calibration: dict[str, Any] = field(default_factory=dict)
    unshare: str | None = None
    unshare_reason: str = ""

    def no_cuda(self) -> str | None:
        return None if self.cuda_path and self.device else f"no CUDA ({self.cuda_short})"

    def limits(self) -> tuple[int, int]:
        """Two different limits for two clients, fitting the GPU: (A, 2A), A up to 2 GiB."""
        a = max(256, min(2048, self.gpu_total_mib // 16)) if self.gpu_total_mib else 1024
        return a, 2 * a


class Session:
    """What every check shares: the arguments, the clock and its budget, the rows and raw numbers, the scratch
    directory, the node's facts, and the client processes (started, grouped, released, killed at the end)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.began = time.monotonic()
        self.deadline: float = self.began + float(args.budget)
        self.rows: list[Row] = []
        self.raw: dict[str, Any] = {}
        self.node = Node()
        self.clients: list[Client] = []
        self.root = args.workdir or tempfile.mkdtemp(prefix="gpufrac-gpu-check-")
        os.makedirs(self.root, exist_ok=True)
        self.clients_dir = os.path.join(self.root, "clients")
        os.makedirs(self.clients_dir, exist_ok=True)
        self.no_mps_dir = os.path.join(self.root, "no-mps")  # a pipe directory with no daemon: clients run alone
        os.makedirs(self.no_mps_dir, exist_ok=True)

    def log(self, message: str) -> None:
        say(f"[{time.monotonic() - self.began:6.1f}s] {message}\n")

    def add(self, row: Row) -> None:
        self.rows.append(row)
        self.log(f"{row.id} {row.name}: {row.status} {row.details}")

    def skip(self, rows: tuple[tuple[str, str], ...], reason: str) -> None:
        for row_id, name in rows:
            self.add(Row(row_id, name, SKIPPED, reason))

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def bounded(self, timeout: float) -> float:
        """A wait's timeout, cut to what is left of the budget (at least 5 s, so a last answer can still come)."""
        return min(timeout, max(self.left(), 5.0))

    def selected(self, check: str) -> bool:
        return not self.args.only or check in self.args.only

    def guarded(self, row_id: str, step: Any) -> None:
        """Runs one check: a bug, or an answer shaped as nobody expected, fails that check, not the whole run."""
        try:
            step()
        except (InterruptedRun, KeyboardInterrupt):
            raise
        except Exception as err:
            self.raw.setdefault("internal_errors", []).append(traceback.format_exc())
            self.add(Row(row_id, f"check {row_id}", FAIL, f"internal error: {type(err).__name__}: {err} "
                                                          "(traceback in the report's raw.internal_errors)"))

    # ---- client processes ----

    def base_env(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items()
                if not k.startswith(("CUDA_MPS_", "NVIDIA_GPU_MEMORY_")) and k != "CUDA_VISIBLE_DEVICES"}

    def client_env(self, pipe_dir: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = self.base_env()
        env[ENV_PIPE_DIRECTORY] = pipe_dir
        if self.node.gpu_uuid:
            env["CUDA_VISIBLE_DEVICES"] = self.node.gpu_uuid
        env.update(extra or {})
        return env

    def start_client(self, name: str, spec: dict[str, Any], env: dict[str, str], pod: bool = False) -> Client:
        spec = {"cuda": self.node.cuda_path, **spec}
        argv = [sys.executable, SCRIPT, "--client", json.dumps(spec)]
        if pod:
            assert self.node.unshare is not None
            argv = [self.node.unshare, "--mount", "--ipc", "--pid", "--fork", "--mount-proc", "--", *argv]
        stderr_path = os.path.join(self.clients_dir, f"{len(self.clients) + 1:02d}-{name}.stderr")
        client = Client(name, argv, env, stderr_path)
        self.clients.append(client)
        return client

    def group(self, clients: list[Client], ready_timeout: float = 120.0, result_timeout: float = 120.0,
              before_go: Any = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Waits until every client is ready, says go to all at once, waits for every result."""
        readies = [c.wait("ready", self.bounded(ready_timeout)) for c in clients]
        if before_go is not None:
            before_go()
        for client in clients:
            client.send("go")
        results = [c.wait("result", self.bounded(result_timeout)) for c in clients]
        return readies, results

    def finish(self, clients: list[Client]) -> None:
        for client in clients:
            client.send("release")
        for client in clients:
            client.close()

    @contextlib.contextmanager
    def row_of(self, row_id: str, name: str, clients: list[Client], numbers: dict[str, Any]) -> Iterator[None]:
        """A row's work with its clients: a client that fails (an error, an exit, a timeout) fails the row; the
        clients are released and closed whatever happens."""
        try:
            yield
        except ClientError as err:
            numbers["error"] = err.event
            self.add(Row(row_id, name, FAIL, str(err), numbers))
        finally:
            self.finish(clients)

    def kill_clients(self) -> None:
        for client in self.clients:
            if client.proc.poll() is None:
                kill_group(client.proc)
                client.proc.wait()

    def sample_processes(self) -> dict[str, Any]:
        """NVML's compute processes on the GPU now: pid -> MiB."""
        nvml, handle = self.node.nvml, self.node.handle
        if nvml is None or handle is None:
            return {}
        try:
            return {str(pid): (used // MIB if used is not None else None)
                    for pid, used in nvml.processes(handle).items()}
        except NvmlError as err:
            return {"error": str(err)}


# ---- 1: inventory, and CUDA's device facts and calibration without MPS ----


class Inventory:
    def __init__(self, session: Session) -> None:
        self.s = session

    def run(self) -> None:
        s, node, args = self.s, self.s.node, self.s.args
        inv: dict[str, Any] = {"nvml_library": args.nvml}
        s.raw["inventory"] = inv
        node.mps_control = args.mps_control if args.mps_control else shutil.which("nvidia-cuda-mps-control")
        if node.mps_control and not os.access(node.mps_control, os.X_OK):
            inv["mps_control_problem"] = f"{node.mps_control} is not executable"
            node.mps_control = None
        inv["mps_control"] = node.mps_control
        self.find_cuda(inv)
        self.find_unshare(inv)
        try:
            gpus = self.read_nvml(inv)
        except (OSError, AttributeError, NvmlError) as err:
            s.add(Row("1", "inventory", FAIL, f"NVML unusable ({args.nvml}): {err}", inv))
            return
        if not gpus:
            s.add(Row("1", "inventory", FAIL, f"NVML reports no GPUs (driver {inv['driver_version']})", inv))
            return
        if args.gpu >= len(gpus):
            s.add(Row("1", "inventory", FAIL, f"--gpu {args.gpu}: the node has {len(gpus)} GPU(s)", inv))
            return
        gpu = gpus[args.gpu]
        assert node.nvml is not None
        node.handle = node.nvml.handle(args.gpu)
        node.gpu_uuid, node.gpu_total_mib, node.compute_mode = gpu["uuid"], gpu["memory_total_mib"], gpu[
            "compute_mode"]
        node.served = modes_to_serve(node.driver_limits) if node.mps_control else ()
        details = self.describe(inv, gpus, gpu)
        s.add(Row("1", "inventory", PASS if node.mps_control else FAIL, "; ".join(details), inv))

    def read_nvml(self, inv: dict[str, Any]) -> list[dict[str, Any]]:
        """The driver, its CUDA version and every GPU, as NVML reports them (into inv); the node's NVML handle."""
        node = self.s.node
        nvml = node.nvml = Nvml(self.s.args.nvml)
        nvml.init()
        inv["driver_version"] = nvml.driver_version()
        inv["cuda_driver_version"] = nvml.cuda_driver_version()
        gpus = []
        for index in range(nvml.device_count()):
            handle = nvml.handle(index)
            memory = nvml.memory(handle)
            try:
                processes: Any = sorted(nvml.processes(handle))
            except NvmlError as err:
                processes = str(err)
            gpus.append({"index": index, "uuid": nvml.uuid(handle), "name": nvml.name(handle),
                         "memory_total_mib": memory.total // MIB, "memory_used_mib": memory.used // MIB,
                         "compute_mode": nvml.compute_mode(handle), "mig": nvml.mig_enabled(handle),
                         "processes": processes})
        inv["gpus"] = gpus
        node.driver_limits = has_driver_memory_limits(inv["driver_version"], inv["cuda_driver_version"])
        inv["driver_memory_limits"] = node.driver_limits
        inv["nvml_memory_limits_api"] = nvml.has("nvmlDeviceSetMemoryLimits_v1")
        return gpus

    def describe(self, inv: dict[str, Any], gpus: list[dict[str, Any]], gpu: dict[str, Any]) -> list[str]:
        node = self.s.node
        cuda_text = f"{inv['cuda_driver_version'] // 1000}.{inv['cuda_driver_version'] % 1000 // 10}"
        names = ", ".join(f"{g['index']}: {g['name']} {g['memory_total_mib']} MiB" for g in gpus)
        details = [f"{len(gpus)} GPU(s) [{names}]; driver {inv['driver_version']}, CUDA {cuda_text}",
                   f"CUDA 13.4 memory limits: {'yes' if node.driver_limits else 'no'}"
                   f" (NVML setter {'present' if inv['nvml_memory_limits_api'] else 'absent'})",
                   f"MPS control: {node.mps_control or 'not found'}",
                   f"compute mode {gpu['compute_mode'] or 'unknown'}",
                   f"checking GPU {self.s.args.gpu} ({gpu['uuid']})"]
        if gpu["mig"]:
            details.append("MIG is enabled (memory limits do not apply to MIG)")
        if gpu["compute_mode"] == "Exclusive_Process" and len(node.served) > 1:
            details.append("WARNING: EXCLUSIVE_PROCESS lets one MPS server at a time use the GPU: the second "
                           "daemon's checks may fail for that reason alone")
        if isinstance(gpu["processes"], str):
            details.append(f"NVML process list unavailable: {gpu['processes']}")
        elif gpu["processes"]:
            details.append(f"WARNING: {len(gpu['processes'])} compute process(es) already on it: timings and "
                           "memory numbers assume an idle GPU")
        if node.cuda_path is None:
            details.append(f"CUDA: {node.cuda_reason}")
        if not node.mps_control:
            details.append("nvidia-cuda-mps-control not found (PATH or --mps-control)")
        return details

    def find_cuda(self, inv: dict[str, Any]) -> None:
        node, path = self.s.node, self.s.args.cuda
        if path == "none":
            node.cuda_reason = node.cuda_short = "disabled with --cuda none"
            return
        try:
            ctypes.CDLL(path)  # only dlopen here: the parent never initializes CUDA
            node.cuda_path = path
        except OSError as err:
            node.cuda_reason = f"{path} cannot be loaded ({err})"
            node.cuda_short = f"{path} cannot be loaded"
        inv["cuda_library"] = node.cuda_path

    def find_unshare(self, inv: dict[str, Any]) -> None:
        node = self.s.node
        unshare = shutil.which("unshare")
        if unshare is None:
            node.unshare_reason = "unshare (util-linux) not found"
        else:
            try:
                probe = subprocess.run([unshare, "--mount", "--ipc", "--pid", "--fork", "--mount-proc", "true"],
                                       capture_output=True, text=True, timeout=15, check=False)
                if probe.returncode == 0:
                    node.unshare = unshare
                else:
                    node.unshare_reason = f"unshare is not permitted here: {probe.stderr.strip()[:160]}"
            except (OSError, subprocess.TimeoutExpired) as err:
                node.unshare_reason = f"unshare failed: {err}"
        inv["unshare"] = node.unshare or node.unshare_reason

    def cuda_setup(self) -> None:
        """Row 1c (only when it fails): a plain CUDA client's device facts, and the spin kernel's calibration."""
        s, node = self.s, self.s.node
        if node.cuda_path is None:
            return
        client = s.start_client("calibrate", {"action": "calibrate", "target_s": s.args.spin_seconds},
                                s.client_env(s.no_mps_dir))
        try:
            readies, results = s.group([client], result_timeout=s.args.spin_seconds * 20 + 60)
            node.device, node.calibration = readies[0], results[0]
            s.raw["cuda"] = {"device": node.device, "calibration": node.calibration}
            s.log(f"CUDA: {node.device['name']}, sm_{node.device['cc_major']}{node.device['cc_minor']}, "
                  f"{node.device['sm_count']} SMs, kernel as {node.device['ptx_target']}; "
                  f"{node.calibration['iterations']} iterations spin {node.calibration['solo_s']:.2f}s alone")
        except ClientError as err:
            node.cuda_reason = node.cuda_short = f"CUDA does not work without MPS: {err}"
            node.device = {}
            s.add(Row("1c", "CUDA without MPS", FAIL, str(err), {"event": err.event}))
        finally:
            client.close()


# ---- 7: the MPS control daemons, one per mode served ----


class Daemons:
    def __init__(self, session: Session) -> None:
        self.s = session
        self.by_mode: dict[str, Daemon] = {}

    def start(self) -> None:
        s, node = self.s, self.s.node
        for mode in node.served:
            assert node.mps_control is not None
            daemon = Daemon(node.mps_control, daemon_layout(s.root, mode), node.driver_limits, s.base_env())
            self.by_mode[mode] = daemon
            started = daemon.start()
            s.log(f"{mode} MPS daemon: {' '.join(started['argv'])} -> "
                  f"{'up' if started['up'] else 'NOT up'} in {started['seconds']}s (pid {started['pid']})")

    def stop(self) -> None:
        for mode, daemon in self.by_mode.items():
            if daemon.proc is not None and not daemon.stopped:
                stopped = daemon.stop(self.s.args.quit_timeout)
                self.s.log(f"{mode} MPS daemon stopped: {stopped['how']} (exit {stopped['exit']}, "
                           f"{stopped['seconds']}s, strays killed {stopped['strays_killed']})")

    def problem(self, mode: str) -> str | None:
        if mode not in self.s.node.served:
            return f"no {mode} daemon: gpufrac serves {mode} only on drivers with the CUDA 13.4 memory limits"
        daemon = self.by_mode.get(mode)
        if daemon is None or not daemon.up:
            return f"the {mode} MPS daemon is not up"
        return None

    def pipe_dir(self, mode: str | None) -> str:
        """The mode's pipe directory; without a mode, one with no daemon (the client runs without MPS)."""
        return self.by_mode[mode].layout.pipe_dir if mode else self.s.no_mps_dir

    def server_pids(self) -> list[int]:
        return mps_server_pids([d.layout.pipe_dir for d in self.by_mode.values()])

    def row(self) -> None:
        if not self.by_mode:
            reason = "no MPS control binary" if not self.s.node.mps_control else "no daemon was started"
            self.s.add(Row("7", "MPS daemons start and stop", SKIPPED, reason))
            return
        problems, parts = [], []
        numbers = {mode: {"started": d.started, "stopped": d.stopped} for mode, d in self.by_mode.items()}
        for mode, daemon in self.by_mode.items():
            start, stop = daemon.started, daemon.stopped
            parts.append(f"{mode}: up in {start.get('seconds')}s, {stop.get('how')} in {stop.get('seconds')}s")
            if not start.get("up"):
                problems.append(f"{mode} never came up (exit {start.get('exit')}: {start.get('log', '')[:160]})")
            if stop.get("how") != "quit" or stop.get("exit") != 0:
                problems.append(f"{mode} did not stop on quit ({stop.get('how')}, exit {stop.get('exit')})")
            if stop.get("strays_killed"):
                problems.append(f"{mode} left MPS processes behind: {stop['strays_killed']}")
        self.s.add(Row("7", "MPS daemons start and stop", FAIL if problems else PASS,
                       "; ".join(problems + parts), numbers))


# ---- 2 and 3: memory limits (MPS pinned; CUDA 13.4's, applied to a cgroup as the toolkit's hook does) ----


class Cgroups:
    """The cgroups check 3 makes (under /sys/fs/cgroup/gpufrac-gpu-check-<pid>), and their removal."""

    def __init__(self, session: Session) -> None:
        self.s = session
        self.made: list[str] = []
        self.root_dmem_enabled = False

    def problem(self) -> str | None:
        node = self.s.node
        if not node.driver_limits:
            return "the driver has no CUDA 13.4 memory limits (needs r615+ and CUDA 13.4)"
        if node.nvml is None or not node.nvml.has("nvmlDeviceSetMemoryLimits_v1"):
            return "NVML has no nvmlDeviceSetMemoryLimits_v1"
        if not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            return "cgroup v2 is not mounted at /sys/fs/cgroup"
        if os.geteuid() != 0:
            return "setting memory limits needs root"
        return None

    def parent(self) -> str:
        parent = f"/sys/fs/cgroup/gpufrac-gpu-check-{os.getpid()}"
        if parent not in self.made:
            os.makedirs(parent, exist_ok=True)
            self.made.append(parent)
            # dmem backend: each level must enable dmem for the leaf to have its own dmem.* files
            with open("/sys/fs/cgroup/cgroup.controllers") as f:
                dmem = "dmem" in f.read().split()
            if dmem:
                with open("/sys/fs/cgroup/cgroup.subtree_control") as f:
                    enabled = "dmem" in f.read().split()
                if not enabled:
                    write_quietly("/sys/fs/cgroup/cgroup.subtree_control", "+dmem")
                    self.root_dmem_enabled = True
                write_quietly(os.path.join(parent, "cgroup.subtree_control"), "+dmem")
        return parent

    def leaf(self, name: str) -> str:
        leaf = os.path.join(self.parent(), name)
        os.makedirs(leaf, exist_ok=True)
        self.made.append(leaf)
        return leaf

    def remove(self) -> None:
        nvml, handle = self.s.node.nvml, self.s.node.handle
        for path in reversed(self.made):
            if nvml is not None and handle is not None and path.count("/") > 4:
                try:  # zero the soft limit first, so dmem ancestors give back the reservation
                    nvml.set_memory_limits(handle, path, 0, NVML_DEVICE_MEMORY_LIMIT_MAX)
                except NvmlError:
                    pass
            try:
                os.rmdir(path)
            except OSError as err:
                self.s.log(f"could not remove cgroup {path}: {err}")
        self.made.clear()
        if self.root_dmem_enabled:
            write_quietly("/sys/fs/cgroup/cgroup.subtree_control", "-dmem")


class MemoryLimits:
    def __init__(self, session: Session, daemons: Daemons) -> None:
        self.s = session
        self.daemons = daemons
        self.cgroups = Cgroups(session)

    def pinned(self, row_id: str, mode: str) -> None:
        """2a, 2b: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, as the webhook writes it, holds each of two clients."""
        s = self.s
        name = f"pinned limit, {mode} daemon"
        reason = s.node.no_cuda() or self.daemons.problem(mode)
        if reason:
            s.add(Row(row_id, name, SKIPPED, reason))
            return
        a, b = s.node.limits()
        pipe = self.daemons.pipe_dir(mode)
        clients = [s.start_client(f"pinned-{mode}-{label}", {"probe_max_mib": probe_max_mib(limit), "hold": True},
                                  s.client_env(pipe, {ENV_PINNED_MEM_LIMIT: format_pinned_mem_limit(limit, 1)}))
                   for label, limit in (("a", a), ("b", b))]
        self.row(row_id, name, clients, (a, b), {"env": {ENV_PINNED_MEM_LIMIT: [
            format_pinned_mem_limit(a, 1), format_pinned_mem_limit(b, 1)]}})

    def driver(self, row_id: str, mode: str | None) -> None:
        """3a-3c: NVIDIA_GPU_MEMORY_REQUEST/LIMIT applied to each client's own cgroup through NVML hold it."""
        s = self.s
        name = f"13.4 limits, {'no MPS' if mode is None else f'{mode} daemon'}"
        reason = self.cgroups.problem() or s.node.no_cuda() or (self.daemons.problem(mode) if mode else None)
        if reason:
            s.add(Row(row_id, name, SKIPPED, reason))
            return
        nvml, handle = s.node.nvml, s.node.handle
        assert nvml is not None and handle is not None
        pipe = self.daemons.pipe_dir(mode)
        a, b = s.node.limits()
        clients: list[Client] = []
        numbers: dict[str, Any] = {"cgroups": []}
        try:
            for label, limit in (("a", a), ("b", b)):
                env = {ENV_MEMORY_REQUEST: memory_env_value(limit // 2), ENV_MEMORY_LIMIT: memory_env_value(limit)}
                leaf = self.cgroups.leaf(f"{row_id}-{label}")
                # as the toolkit's apply-cuda-memory-limits hook: the env's MiB, in bytes, on the cgroup
                nvml.set_memory_limits(handle, leaf, int(env[ENV_MEMORY_REQUEST]) * MIB,
                                       int(env[ENV_MEMORY_LIMIT]) * MIB)
                numbers["cgroups"].append({"path": leaf, "env": env, "backend": "dmem" if os.path.exists(
                    os.path.join(leaf, "dmem.max")) else "misc", "read_back": nvml.get_memory_limits(handle, leaf)})
                clients.append(s.start_client(f"limits-{row_id}-{label}", {
                    "probe_max_mib": probe_max_mib(limit), "hold": True, "cgroup": leaf}, s.client_env(pipe, env)))
        except (OSError, NvmlError) as err:
            for client in clients:
                client.close()
            s.add(Row(row_id, name, FAIL, f"setting the limits failed: {err}", numbers))
            return
        self.row(row_id, name, clients, (a, b), numbers)

    def row(self, row_id: str, name: str, clients: list[Client], limits: tuple[int, ...],
            numbers: dict[str, Any]) -> None:
        """Two clients probing at once, each to its own limit; both hold their memory until both are done."""
        s = self.s
        with s.row_of(row_id, name, clients, numbers):
            readies, results = s.group(clients)
            numbers["nvml_processes"] = s.sample_processes()
            verdicts = [judge_probe(limit, r["probe"]) for limit, r in zip_pairs(limits, results)]
            numbers["clients"] = [{"limit_mib": limit, "probe": {k: v for k, v in r["probe"].items() if k != "chunks"},
                                   "mem_before": ready.get("mem"), "mem_after": r.get("mem_after"), "pid": ready["pid"]}
                                  for limit, ready, r in zip3(limits, readies, results)]
            status = PASS if all(v[0] == PASS for v in verdicts) else FAIL
            texts = [f"client {chr(97 + i)}: {text} (cuMemGetInfo total {r.get('mem_after', {}).get('total_mib')} MiB)"
                     for i, ((_, text), r) in enumerate(zip_pairs(verdicts, results))]
            s.add(Row(row_id, name, status, "; ".join(texts), numbers))


# ---- 4: compute modes ----


class Compute:
    def __init__(self, session: Session, daemons: Daemons) -> None:
        self.s = session
        self.daemons = daemons

    def run(self, row_id: str, mode: str | None) -> None:
        """4a: two spinning clients finish together under sm-sharing; 4b, 4c: they take turns."""
        s = self.s
        expect = "together" if mode == SM_SHARING else "turns"
        label = "no MPS" if mode is None else f"{mode} daemon"
        name = f"compute, {label}: {expect}"
        reason = s.node.no_cuda() or (self.daemons.problem(mode) if mode else None)
        if reason:
            s.add(Row(row_id, name, SKIPPED, reason))
            return
        if mode is None and s.node.compute_mode == "Exclusive_Process":
            s.add(Row(row_id, name, SKIPPED, "the GPU is in EXCLUSIVE_PROCESS mode: two non-MPS clients cannot "
                                             "share it"))
            return
        calibration = s.node.calibration
        iterations = calibration["iterations"]
        clients = [s.start_client(f"compute-{row_id}-{x}", {"spin_iterations": iterations},
                                  s.client_env(self.daemons.pipe_dir(mode))) for x in "ab"]
        numbers: dict[str, Any] = {"iterations": iterations, "solo_s": calibration["solo_s"]}
        with s.row_of(row_id, name, clients, numbers):
            _, results = s.group(clients, result_timeout=s.args.spin_seconds * 6 + 60)
            span = max(r["t_done"] for r in results) - min(r["t_go"] for r in results)
            numbers.update(span_s=span, clients=[r["spin"] for r in results])
            status, text = judge_compute(expect, calibration["solo_s"], span)
            durations = ", ".join(f"{r['spin']['host_s']:.2f}s" for r in results)
            s.add(Row(row_id, name, status, f"{text}; each client's kernel took {durations}", numbers))


# ---- 5: pods ----


class Pods:
    DELIVERED = "5a", "two sm-sharing pods, delivered mounts"
    PRIVATE = "5b", "sm-sharing pod, private /dev/shm"

    def __init__(self, session: Session, daemons: Daemons) -> None:
        self.s = session
        self.daemons = daemons
        self.shm_marker = f"/dev/shm/gpufrac-gpu-check-{os.getpid()}"

    def spec(self, shm_delivered: bool) -> dict[str, Any]:
        """What a pod's mount namespace hides and what gpufrac delivers into it."""
        s = self.s
        sm = daemon_layout(s.root, SM_SHARING)
        ts = daemon_layout(s.root, TIME_SLICING)
        hide = [s.root] + [p for p in ("/tmp/nvidia-mps", "/var/log/nvidia-mps", os.path.dirname(GPUFRAC_MPS_ROOT))
                           if os.path.isdir(p)]
        return {"hide": hide, "deliver": [{"source": sm.pipe_dir, "target": sm.pipe_dir}],
                "shm_delivered": shm_delivered, "pipe_dir": sm.pipe_dir, "shm_marker": self.shm_marker,
                "expect_hidden": [sm.log_dir, ts.pipe_dir, s.clients_dir], "mps_control": s.node.mps_control}

    def run(self) -> None:
        s = self.s
        a, b = s.node.limits()
        reason = self.daemons.problem(SM_SHARING) or (None if s.node.unshare else s.node.unshare_reason)
        if reason:
            s.skip((self.DELIVERED, self.PRIVATE), reason)
            return
        with open(self.shm_marker, "w") as marker:
            marker.write("gpufrac gpu check: visible only where the daemon's /dev/shm is\n")
        host_ns = {ns: os.readlink(f"/proc/self/ns/{ns}") for ns in ("ipc", "mnt", "pid")}
        self.row(*self.DELIVERED, [(a, "a"), (b, "b")], host_ns, shm_delivered=True)
        if s.node.no_cuda() is None and s.rows[-1].status != PASS:
            s.add(Row(*self.PRIVATE, SKIPPED, "no answer: pods with the daemon's /dev/shm did not work either (5a)"))
            return
        self.row(*self.PRIVATE, [(a, "c")], host_ns, shm_delivered=False)

    def remove_marker(self) -> None:
        try:
            os.unlink(self.shm_marker)
        except OSError:
            pass

    def row(self, row_id: str, name: str, pods: list[tuple[int, str]], host_ns: dict[str, str],
            shm_delivered: bool) -> None:
        s = self.s
        pipe = daemon_layout(s.root, SM_SHARING).pipe_dir
        cuda = s.node.no_cuda() is None
        clients = []
        for limit, label in pods:
            spec: dict[str, Any] = {"pod": self.spec(shm_delivered)}
            if cuda:
                spec.update(probe_max_mib=probe_max_mib(limit), hold=True)
            else:
                spec["cuda"] = None
            clients.append(s.start_client(f"pod-{label}", spec, s.client_env(
                pipe, {ENV_PINNED_MEM_LIMIT: format_pinned_mem_limit(limit, 1)}), pod=True))
        numbers: dict[str, Any] = {"shm_delivered": shm_delivered, "pods": []}
        with s.row_of(row_id, name, clients, numbers):
            facts = [c.wait("pod", s.bounded(60))["facts"] for c in clients]
            problems = [f"pod {label}: {p}" for f, (_, label) in zip_pairs(facts, pods)
                        for p in judge_pod(f, host_ns, shm_delivered)]
            numbers["pods"] = facts
            shm = "the daemon's" if shm_delivered else "a private"
            isolation = (f"{len(pods)} pod(s): own PID/IPC/mount namespaces, pid 1, see the pipe directory "
                         f"(control daemon reached), not the logs or the other mode's pipe directory, {shm} /dev/shm")
            if problems:
                s.add(Row(row_id, name, FAIL, "the pod emulation is wrong: " + "; ".join(problems), numbers))
                return
            if not cuda:
                s.add(Row(row_id, name, SKIPPED, f"{s.node.no_cuda()}; namespaces checked: {isolation}", numbers))
                return
            self.cuda(row_id, name, clients, pods, numbers, isolation, shm_delivered)

    def cuda(self, row_id: str, name: str, clients: list[Client], pods: list[tuple[int, str]],
             numbers: dict[str, Any], isolation: str, shm_delivered: bool) -> None:
        s = self.s
        try:
            _, results = s.group(clients)
        except ClientError as err:
            numbers["error"] = err.event
            if shm_delivered:
                s.add(Row(row_id, name, FAIL, str(err), numbers))
            else:
                numbers["shm_needed"] = True
                s.add(Row(row_id, name, PASS, f"answer: the daemon's /dev/shm IS needed: without it the client "
                                              f"fails ({err})", numbers))
            return
        verdicts = [judge_probe(limit, r["probe"]) for (limit, _), r in zip_pairs(pods, results)]
        numbers["clients"] = [{"limit_mib": limit, "probe": {k: v for k, v in r["probe"].items() if k != "chunks"}}
                              for (limit, _), r in zip_pairs(pods, results)]
        texts = "; ".join(f"pod {label}: {text}" for (_, label), (_, text) in zip_pairs(pods, verdicts))
        held = all(v[0] == PASS for v in verdicts)
        if not shm_delivered:
            numbers["shm_needed"] = False
            status = PASS if held else FAIL
            s.add(Row(row_id, name, status, f"answer: the daemon's /dev/shm is NOT needed: the client connects "
                                            f"without it; {texts}", numbers))
            return
        s.add(Row(row_id, name, PASS if held else FAIL, f"{texts}; {isolation}", numbers))


# ---- 6: attribution ----


class Attribution:
    MEMORY = "6a", "attribution: memory"
    UTILIZATION = "6b", "attribution: utilization"

    def __init__(self, session: Session, daemons: Daemons) -> None:
        self.s = session
        self.daemons = daemons

    def run(self) -> None:
        """While two sm-sharing clients hold memory and spin, NVML names each client, not only the MPS server."""
        s = self.s
        reason = s.node.no_cuda() or self.daemons.problem(SM_SHARING)
        if reason:
            s.skip((self.MEMORY, self.UTILIZATION), reason)
            return
        a, _ = s.node.limits()
        alloc = a // 2
        spin_s = max(s.args.spin_seconds, 4.0)
        iterations = int(s.node.calibration["iterations"] * spin_s / s.args.spin_seconds)
        blocks = 2 * int(s.node.device.get("sm_count", 1))
        clients = [s.start_client(f"attribution-{x}", {"alloc_mib": alloc, "spin_iterations": iterations,
                                                       "blocks": blocks, "threads": 128},
                                  s.client_env(self.daemons.pipe_dir(SM_SHARING),
                                               {ENV_PINNED_MEM_LIMIT: format_pinned_mem_limit(a, 1)}))
                   for x in "ab"]
        numbers: dict[str, Any] = {"alloc_mib": alloc, "blocks": blocks}
        try:
            for client in clients:
                client.wait("ready", s.bounded(120))
            since = int(time.time() * 1e6)
            for client in clients:
                client.send("go")
            for client in clients:
                client.wait("allocated", s.bounded(60))
            pids = [c.proc.pid for c in clients]
            memory, util = self.sample(since, spin_s * 0.8, numbers)
            for client in clients:
                client.wait("result", s.bounded(spin_s * 4 + 60))
            servers = self.daemons.server_pids()
            numbers.update(client_pids=pids, mps_server_pids=servers,
                           memory_mib={str(p): (u // MIB if u else u) for p, u in memory.items()},
                           sm_util={str(p): u for p, u in util.items()})
            s.add(attribution_memory_row(*self.MEMORY, pids, servers, memory, alloc, numbers))
            s.add(attribution_util_row(*self.UTILIZATION, pids, servers, util, numbers))
        except (ClientError, NvmlError) as err:
            numbers["error"] = getattr(err, "event", str(err))
            for row_id, name in (self.MEMORY, self.UTILIZATION):
                s.add(Row(row_id, name, FAIL, str(err), numbers))
        finally:
            s.finish(clients)

    def sample(self, since_us: int, seconds: float,
               numbers: dict[str, Any]) -> tuple[dict[int, int | None], dict[int, int]]:
        """Each PID's most memory and SM utilization NVML reports over `seconds`."""
        nvml, handle = self.s.node.nvml, self.s.node.handle
        assert nvml is not None and handle is not None
        memory: dict[int, int | None] = {}
        util: dict[int, int] = {}
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.5)
            for pid, used in nvml.processes(handle).items():
                memory[pid] = max(memory.get(pid) or 0, used or 0) if used is not None else memory.get(pid)
            try:
                samples = nvml.utilization(handle, since_us)
            except NvmlError as err:
                numbers["utilization_error"] = str(err)
                samples = []
            for pid, _, sm in samples:
                util[pid] = max(util.get(pid, 0), sm)
        return memory, util


# ---- 8: the node's container runtime (containerd 2 with NRI and CDI, gpufrac's NRI plugin, NVIDIA's CDI spec) ----


class Runtime:
    """Two pods made through the node's CRI with `crictl`, as the kubelet would make them: a bound sm-sharing
    fraction whose GPU is named by its CDI device (`k8s.device-plugin.nvidia.com/gpu=<uuid>`, as KAI's binder writes
    it on CDI clusters), and a plain pod that asks for every GPU by env. gpufrac's NRI plugin decides what each
    container gets; NVIDIA's CDI spec for that device carries the hook that applies the CUDA 13.4 limits."""

    CDI_DEVICES = "8a", "CDI device: exactly its GPU"
    CDI_LIMITS = "8b", "CDI device: 13.4 limits on its cgroup"
    OUTSIDE = "8c", "outside the plugin's decision: no GPU"

    def __init__(self, session: Session) -> None:
        self.s = session
        self.crictl: str | None = None
        self.image: str | None = None
        self.sandboxes: list[str] = []
        self.dir = os.path.join(session.root, "runtime")

    def problem(self) -> str | None:
        args = self.s.args
        self.crictl = args.crictl or shutil.which("crictl")
        if self.crictl is None or not os.access(self.crictl, os.X_OK):
            return "crictl not found (PATH or --crictl): the runtime checks make pods through the node's CRI"
        endpoint = args.runtime_endpoint
        if endpoint.startswith("unix://") and not is_socket(endpoint[len("unix://"):]):
            return f"no CRI socket at {endpoint} (--runtime-endpoint)"
        self.image = args.image or self.find_image()
        if not self.image:
            return "no --image, and no gpufrac image on the node: name one there with sh, ls and sleep"
        return None

    def find_image(self) -> str | None:
        try:
            return gpufrac_image(json.loads(self.call("images", "-o", "json")))
        except (RuntimeError, ValueError):
            return None

    def run(self) -> None:
        s = self.s
        rows = (self.CDI_DEVICES, self.CDI_LIMITS, self.OUTSIDE)
        reason = self.problem() or (None if s.node.gpu_uuid else "no GPU to name")
        if reason:
            s.skip(rows, reason)
            return
        os.makedirs(self.dir, exist_ok=True)
        s.guarded(self.CDI_DEVICES[0], self.cdi)
        s.guarded(self.OUTSIDE[0], self.outside)

    def cdi(self) -> None:
        """8a and 8b: one bound fraction, its GPU by CDI name."""
        s, node = self.s, self.s.node
        assert node.gpu_uuid is not None
        request, limit = node.limits()
        devices = f"{DEVICE_PLUGIN_CDI_KIND}={node.gpu_uuid}"
        pipe_dir = os.path.join(GPUFRAC_MPS_ROOT, SM_SHARING)
        numbers: dict[str, Any] = {"devices": devices, "request_mib": request, "limit_mib": limit}
        try:
            container = self.start_pod("cdi", fraction_annotations(FRACTION_CONTAINER, SM_SHARING, request, limit,
                                                                   devices),
                                       FRACTION_CONTAINER, fraction_env(request, limit, pipe_dir, devices))
            seen = self.devices(container)
        except (RuntimeError, OSError, ValueError) as err:
            s.skip((self.CDI_LIMITS,), "no container (8a)")
            s.add(Row(*self.CDI_DEVICES, FAIL, f"{devices}: {err}", numbers))
            return
        status, text = judge_devices(seen, f"nvidia{s.args.gpu}")
        s.add(Row(*self.CDI_DEVICES, status, f"{devices}: {text}", {**numbers, "seen": seen}))
        self.limits(container, request, limit, numbers)

    def limits(self, container: str, request: int, limit: int, numbers: dict[str, Any]) -> None:
        s, node = self.s, self.s.node
        row_id, name = self.CDI_LIMITS
        reason = None if node.driver_limits else "the driver has no CUDA 13.4 memory limits (needs r615+ and CUDA 13.4)"
        if not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            reason = reason or "cgroup v2 is not mounted at /sys/fs/cgroup (the 13.4 limits are per cgroup v2)"
        if reason:
            s.add(Row(row_id, name, SKIPPED, reason))
            return
        assert node.nvml is not None and node.handle is not None
        try:
            cgroup = self.cgroup(container)
            read_back = node.nvml.get_memory_limits(node.handle, cgroup)
        except (RuntimeError, OSError, ValueError, NvmlError) as err:
            s.add(Row(row_id, name, FAIL, str(err), numbers))
            return
        status, text = judge_container_limits(read_back, request, limit)
        s.add(Row(row_id, name, status, f"{text} ({cgroup})", {**numbers, "cgroup": cgroup, "read_back": read_back}))

    def outside(self) -> None:
        row_id, name = self.OUTSIDE
        try:
            seen = self.devices(self.start_pod("plain", {}, "plain", {"NVIDIA_VISIBLE_DEVICES": "all"}))
        except (RuntimeError, OSError, ValueError) as err:
            self.s.add(Row(row_id, name, FAIL, str(err)))
            return
        status, text = judge_devices(seen, None)
        self.s.add(Row(row_id, name, status, f"a plain pod with NVIDIA_VISIBLE_DEVICES=all: {text}",
                       {"seen": seen}))

    # ---- crictl ----

    def call(self, *argv: str, timeout: float | None = None) -> str:
        assert self.crictl is not None
        cmd = [self.crictl, "--runtime-endpoint", self.s.args.runtime_endpoint, *argv]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, check=False,
                                  timeout=timeout if timeout is not None else self.s.bounded(90))
        except subprocess.TimeoutExpired as err:
            raise RuntimeError(f"crictl {argv[0]} did not answer within {err.timeout:.0f}s") from None
        if done.returncode != 0:
            raise RuntimeError(f"crictl {argv[0]}: {(done.stderr or done.stdout).strip()[-400:]}")
        return done.stdout.strip()

    def write(self, name: str, config: dict[str, Any]) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            json.dump(config, f)
        return path

    def start_pod(self, pod: str, annotations: dict[str, str], container: str, env: dict[str, str]) -> str:
        """A pod sandbox (host network) with these annotations and one running container; the container's id."""
        uid = f"gpufrac-gpu-check-{os.getpid()}-{pod}"
        sandbox = self.write(f"{pod}-pod.json", {
            "metadata": {"name": f"gpu-check-{pod}", "namespace": "gpufrac-gpu-check", "uid": uid, "attempt": 0},
            "annotations": annotations, "log_directory": os.path.join(self.dir, f"{pod}-logs"),
            "linux": {"security_context": {"namespace_options": {"network": 2}}}})  # NODE: no CNI needed
        sandbox_id = self.call("runp", sandbox)
        self.sandboxes.append(sandbox_id)
        config = self.write(f"{pod}-{container}.json", {
            "metadata": {"name": container}, "image": {"image": self.image},
            "command": ["sleep", "3600"], "envs": [{"key": k, "value": v} for k, v in env.items()],
            "log_path": f"{container}.log"})
        container_id = self.call("create", sandbox_id, config, sandbox)  # the plugin may refuse it here
        self.call("start", container_id)
        return container_id

    def devices(self, container_id: str) -> list[str]:
        """The NVIDIA device nodes the container sees."""
        listing = self.call("exec", container_id, "ls", "/dev")
        return sorted(name for name in listing.split() if name.startswith("nvidia"))

    def cgroup(self, container_id: str) -> str:
        """The container's cgroup v2 directory on the host (what the toolkit's hook hands NVML)."""
        pid = json.loads(self.call("inspect", container_id)).get("info", {}).get("pid")
        if not pid:
            raise RuntimeError(f"crictl inspect {container_id}: no pid")
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return "/sys/fs/cgroup" + line[3:].strip()
        raise RuntimeError(f"pid {pid} has no cgroup v2 path")

    def cleanup(self) -> None:
        for sandbox_id in reversed(self.sandboxes):
            for step in ("stopp", "rmp"):
                try:
                    self.call(step, sandbox_id, timeout=60)
                except RuntimeError as err:
                    self.s.log(f"could not {step} {sandbox_id}: {err}")
        self.sandboxes.clear()


# ---- the whole run ----


class Run:
    """The checks in their order (without MPS first, before any MPS server holds the GPU), then the cleanup."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.session = session = Session(args)
        self.inventory = Inventory(session)
        self.daemons = Daemons(session)
        self.memory = MemoryLimits(session, self.daemons)
        self.compute = Compute(session, self.daemons)
        self.pods = Pods(session, self.daemons)
        self.attribution = Attribution(session, self.daemons)
        self.runtime = Runtime(session)

    def steps(self) -> list[tuple[tuple[str, ...], Any]]:
        memory, compute = self.memory, self.compute
        return [
            (("4b",), lambda: compute.run("4b", None)),
            (("3a",), lambda: memory.driver("3a", None)),
            (("2a",), lambda: memory.pinned("2a", SM_SHARING)),
            (("2b",), lambda: memory.pinned("2b", TIME_SLICING)),
            (("3b",), lambda: memory.driver("3b", TIME_SLICING)),
            (("3c",), lambda: memory.driver("3c", SM_SHARING)),
            (("4a",), lambda: compute.run("4a", SM_SHARING)),
            (("4c",), lambda: compute.run("4c", TIME_SLICING)),
            (("5a", "5b"), self.pods.run),
            (("6a", "6b"), self.attribution.run),
            (("8a", "8b", "8c"), self.runtime.run),
        ]

    def run(self) -> None:
        s = self.session
        s.guarded("1", self.inventory.run)
        if s.node.nvml is None or s.node.handle is None:
            return
        s.guarded("1c", self.inventory.cuda_setup)
        self.daemons.start()
        if s.args.linger:
            s.log(f"daemons up; lingering {s.args.linger}s (--linger)")
            time.sleep(s.args.linger)
        for rows, step in self.steps():
            if not s.selected(rows[0][0]):
                continue
            if s.left() < 20:
                s.skip(tuple((row_id, f"check {row_id}") for row_id in rows), "the time budget (--budget) is used up")
                continue
            s.guarded(rows[0], step)

    def cleanup(self) -> None:
        self.session.kill_clients()
        self.runtime.cleanup()
        self.daemons.stop()
        self.memory.cgroups.remove()
        self.pods.remove_marker()
        if self.session.node.nvml is not None:
            self.session.node.nvml.shutdown()


def say(text: str) -> None:
    """Progress on stdout; a closed stdout (a pipe to `head`, a dropped ssh) must not stop the check or its cleanup."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError:
        pass


def write_quietly(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError:
        pass


def zip_pairs(first: Any, second: Any) -> list[tuple[Any, Any]]:
    """zip() of two sequences of equal length, without zip's strict= (Python 3.10+)."""
    first, second = list(first), list(second)
    assert len(first) == len(second)
    return [(first[i], second[i]) for i in range(len(first))]


def zip3(first: Any, second: Any, third: Any) -> list[tuple[Any, Any, Any]]:
    return [(a, b, c) for (a, b), c in zip_pairs(zip_pairs(first, second), third)]


def attribution_memory_row(row_id: str, name: str, pids: list[int], servers: list[int],
                           memory: dict[int, int | None], alloc_mib: int, numbers: dict[str, Any]) -> Row:
    missing = [p for p in pids if p not in memory]
    short = [p for p in pids if p in memory and (memory[p] or 0) < alloc_mib * MIB * 0.9]
    seen = ", ".join(f"{p}: {mib_text(memory[p])}" for p in pids if p in memory)
    on_server = ", ".join(f"server {p}: {(memory.get(p) or 0) // MIB} MiB" for p in servers if p in memory)
    text = f"clients {seen or 'none listed'}" + (f"; {on_server}" if on_server else "")
    if missing:
        return Row(row_id, name, FAIL, f"client(s) {missing} not in NVML's process list; {text}", numbers)
    if short:
        return Row(row_id, name, FAIL, f"client(s) {short} listed with less than the {alloc_mib} MiB they hold; "
                                       f"{text}", numbers)
    return Row(row_id, name, PASS, f"each client listed with its {alloc_mib} MiB: {text}", numbers)


def mib_text(used: int | None) -> str:
    return "n/a" if used is None else f"{used // MIB} MiB"


def attribution_util_row(row_id: str, name: str, pids: list[int], servers: list[int], util: dict[int, int],
                         numbers: dict[str, Any]) -> Row:
    if "utilization_error" in numbers and not util:
        status = SKIPPED if "Not Supported" in numbers["utilization_error"] else FAIL
        return Row(row_id, name, status, f"nvmlDeviceGetProcessUtilization: {numbers['utilization_error']}", numbers)
    seen = ", ".join(f"{p}: {u}%" for p, u in sorted(util.items()))
    missing = [p for p in pids if util.get(p, 0) <= 0]
    if missing:
        who = "the MPS server" if any(util.get(p, 0) > 0 for p in servers) else "no one"
        return Row(row_id, name, FAIL, f"no SM utilization for client(s) {missing}; samples name {who} "
                                       f"({seen or 'no samples'})", numbers)
    return Row(row_id, name, PASS, f"each spinning client has its own SM utilization: {seen}", numbers)


# ---------------------------------------------------------------------------------------------------------------
# The table and the report.
# ---------------------------------------------------------------------------------------------------------------


def row_order(row: Row) -> tuple[int, str]:
    digits = "".join(c for c in row.id if c.isdigit())
    return (int(digits) if digits else 99, row.id)


def render_table(rows: list[Row], header: str) -> str:
    width = max([len(r.name) for r in rows] + [5])
    lines = [header, f"{'#':<4} {'check':<{width}} {'status':<8} details", "-" * (width + 30)]
    for row in sorted(rows, key=row_order):
        wrapped = textwrap.wrap(row.details, 100) or [""]
        lines.append(f"{row.id:<4} {row.name:<{width}} {row.status:<8} {wrapped[0]}")
        lines.extend(f"{'':<4} {'':<{width}} {'':<8} {more}" for more in wrapped[1:])
    counts = {s: sum(1 for r in rows if r.status == s) for s in (PASS, FAIL, SKIPPED)}
    lines.append("-" * (width + 30))
    lines.append(f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIPPED]} skipped")
    return "\n".join(lines) + "\n"


def write_report(session: Session, table: str, interrupted: str | None) -> None:
    out = session.args.out
    seconds = time.monotonic() - session.began
    report = {
        "tool": "gpufrac gpu_check", "host": socket.gethostname(),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds)),
        "seconds": round(seconds, 1), "argv": sys.argv[1:], "workdir": session.root,
        "interrupted": interrupted, "failed": any(r.status == FAIL for r in session.rows),
        "checks": [{"id": r.id, "name": r.name, "status": r.status, "details": r.details, "numbers": r.numbers}
                   for r in sorted(session.rows, key=row_order)],
        "raw": session.raw, "table": table,
    }
    directory = os.path.dirname(os.path.abspath(out))
    os.makedirs(directory, exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=2, default=str)
        f.write("\n")
    with open(os.path.splitext(out)[0] + ".txt", "w") as f:
        f.write(table)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gpu_check.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="gpufrac's hardware check: MPS pinned limits, CUDA 13.4 memory limits, compute modes, pod "
                    "isolation and NVML attribution on this node's GPU. Run as root on an idle GPU node.",
        epilog="Exit status: 0 when no check FAILed, 1 when one did, 2 for bad arguments, 130 when interrupted.")
    parser.add_argument("--mps-control", help="the nvidia-cuda-mps-control to use (default: the one on PATH)")
    parser.add_argument("--nvml", default="libnvidia-ml.so.1", help="NVML library path (default: %(default)s)")
    parser.add_argument("--cuda", default="libcuda.so.1",
                        help="CUDA driver library path, or 'none' to skip the CUDA checks (default: %(default)s)")
    parser.add_argument("--gpu", type=int, default=0, help="index of the GPU to check (default: %(default)s)")
    parser.add_argument("--out", default="gpu-check-report.json",
                        help="where to write the JSON report; the table goes next to it as .txt (default: %(default)s)")
    parser.add_argument("--workdir", help="scratch directory for the daemons' pipe and log directories "
                                          "(default: a new one under $TMPDIR, removed afterwards)")
    parser.add_argument("--keep-workdir", action="store_true", help="keep the scratch directory (logs) afterwards")
    parser.add_argument("--only", type=lambda s: set(s.split(",")), default=set(),
                        help="run only these checks, e.g. --only 2,4 (the inventory and the daemons always run)")
    parser.add_argument("--spin-seconds", type=float, default=3.0,
                        help="how long one client's kernel spins alone in check 4 (default: %(default)s)")
    parser.add_argument("--budget", type=float, default=480.0,
                        help="seconds after which remaining checks are skipped; stopping the daemons comes after "
                             "(default: %(default)s, so that the whole run stays under ten minutes)")
    parser.add_argument("--quit-timeout", type=float, default=30.0,
                        help="seconds a daemon gets to exit after quit before it is killed (default: %(default)s)")
    parser.add_argument("--linger", type=float, default=0.0,
                        help="wait this long after starting the daemons, before the checks (to inspect them)")
    parser.add_argument("--crictl", help="the crictl for the runtime checks (8a, 8b; default: the one on PATH)")
    parser.add_argument("--runtime-endpoint",
                        default=os.environ.get("CONTAINER_RUNTIME_ENDPOINT", "unix:///run/containerd/containerd.sock"),
                        help="the node's CRI socket (default: $CONTAINER_RUNTIME_ENDPOINT or %(default)s)")
    parser.add_argument("--image", help="an image already on the node with sh, ls and sleep, for the runtime checks' "
                                        "containers (default: gpufrac's own, as crictl lists it)")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.client:
        return client_main(json.loads(args.client))
    run = Run(args)
    session = run.session
    interrupted: str | None = None

    def on_signal(signum: int, _frame: Any) -> None:
        raise InterruptedRun(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    session.log(f"gpufrac gpu check on {socket.gethostname()}; scratch directory {session.root}")
    try:
        run.run()
    except InterruptedRun as err:
        interrupted = str(err)
        session.log(f"interrupted by {interrupted}: stopping the clients and daemons")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the cleanup short
        run.cleanup()
    run.daemons.row()
    if interrupted:
        session.add(Row("9", "run", FAIL, f"interrupted by {interrupted}"))
    inv = session.raw.get("inventory", {})
    header = (f"gpufrac gpu check: {socket.gethostname()}, driver {inv.get('driver_version', '?')}, "
              f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, {time.monotonic() - session.began:.0f}s")
    table = render_table(session.rows, header)
    try:
        write_report(session, table, interrupted)
        written = f"report: {args.out} (table: {os.path.splitext(args.out)[0]}.txt)"
    except OSError as err:
        written = f"could not write the report to {args.out}: {err}"
    if not args.keep_workdir and not args.workdir:
        shutil.rmtree(session.root, ignore_errors=True)
    say("\n" + table + written + "\n")
    if interrupted:
        return 130
    return 1 if any(r.status == FAIL for r in session.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
