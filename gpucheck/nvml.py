"""NVML through ctypes. Layouts from the NVML API reference (docs.nvidia.com/deploy/nvml-api) and nvml.h; the tests
cross-check each one against NVIDIA's own nvidia-ml-py (pynvml) definitions."""

from __future__ import annotations

import ctypes
from typing import Any

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
