"""NVML through pynvml (edge): the inventory and the running compute processes with their SM utilization, and the
GPUs' critical XID errors (XidWatch)."""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable

import pynvml

from gpufrac.agent.decide.errors import NvmlError
from gpufrac.agent.decide.model import GpuInfo, GpuMemory, GpuProcess, Inventory
from gpufrac.agent.decide.reclaim import UsageReading

log = logging.getLogger(__name__)


class _SetLimits(ctypes.Structure):
    # nvmlSetMemoryLimits_v1_t (CUDA 13.4 NVML): nameSpace, the cgroup directory's full path; limits in bytes
    _fields_ = [("nameSpace", ctypes.c_char_p), ("softLimit", ctypes.c_ulonglong), ("hardLimit", ctypes.c_ulonglong)]


class _GetLimits(ctypes.Structure):
    _fields_ = [("nameSpace", ctypes.c_char_p), ("softLimit", ctypes.c_ulonglong), ("hardLimit", ctypes.c_ulonglong),
                ("currentUsed", ctypes.c_ulonglong)]


def _check(code: int) -> None:
    if code != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(code)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NvmlSource:
    """Initializes NVML lazily, and again after an error (a driver reload, a lost GPU)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._initialized = False
        self._last_sample_us: dict[str, int] = {}  # per GPU: timestamp of the newest utilization sample seen

    def _ensure(self) -> None:
        if not self._initialized:
            pynvml.nvmlInit()
            self._initialized = True

    def _reset(self) -> None:
        if self._initialized:
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass
            self._initialized = False

    def inventory(self) -> Inventory:
        with self._lock:
            try:
                self._ensure()
                gpus = []
                for index in range(pynvml.nvmlDeviceGetCount()):
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                    gpus.append(
                        GpuInfo(
                            index=pynvml.nvmlDeviceGetIndex(handle),
                            uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                            name=_text(pynvml.nvmlDeviceGetName(handle)),
                            memory_total_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                        )
                    )
                return Inventory(
                    driver_version=_text(pynvml.nvmlSystemGetDriverVersion()).strip(),
                    cuda_driver_version=int(pynvml.nvmlSystemGetCudaDriverVersion_v2()),
                    gpus=tuple(gpus),
                )
            except pynvml.NVMLError as err:
                self._reset()
                raise NvmlError(f"NVML: {err}") from err

    def processes(self) -> list[GpuProcess]:
        """Compute processes on every GPU, with the newest SM utilization sample of each (None if none)."""
        with self._lock:
            try:
                self._ensure()
                result = []
                for index in range(pynvml.nvmlDeviceGetCount()):
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                    uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
                    util = self._utilization(handle, uuid)
                    for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                        if proc.pid == 0:
                            continue
                        used = proc.usedGpuMemory
                        result.append(
                            GpuProcess(
                                uuid,
                                int(proc.pid),
                                int(used) if used is not None else None,
                                util.get(int(proc.pid)),
                            )
                        )
                return result
            except pynvml.NVMLError as err:
                self._reset()
                raise NvmlError(f"NVML: {err}") from err

    def memory(self) -> dict[str, GpuMemory]:
        """Each GPU's memory by UUID, with the driver's reserve (v2 memory info). A driver without v2 gives v1's
        figures, whose `used` holds the reserve: then reserved reads 0 and used holds it, free is the same."""
        with self._lock:
            try:
                self._ensure()
                result = {}
                for index in range(pynvml.nvmlDeviceGetCount()):
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                    uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
                    result[uuid] = self._memory(handle, uuid)
                return result
            except pynvml.NVMLError as err:
                self._reset()
                raise NvmlError(f"NVML: {err}") from err

    def reading(self) -> UsageReading:
        """One reading of what each GPU's processes use and of its free memory, taken together: per GPU, the
        process list and the memory info are read back to back, so that free and usage describe the same moment
        (reclaim compares them), not two moments an audit pass apart."""
        with self._lock:
            try:
                self._ensure()
                processes: list[GpuProcess] = []
                memory = {}
                for index in range(pynvml.nvmlDeviceGetCount()):
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                    uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
                    processes.extend(
                        GpuProcess(uuid, int(p.pid), int(p.usedGpuMemory) if p.usedGpuMemory is not None else None,
                                   None)
                        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid != 0)
                    memory[uuid] = self._memory(handle, uuid)
                return UsageReading(tuple(processes), memory)
            except pynvml.NVMLError as err:
                self._reset()
                raise NvmlError(f"NVML: {err}") from err

    @staticmethod
    def _memory(handle: object, uuid: str) -> GpuMemory:
        try:
            info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            reserved = int(info.reserved)
        except (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NotSupported,
                pynvml.NVMLError_ArgumentVersionMismatch):
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            reserved = 0
        return GpuMemory(uuid, int(info.total), reserved, int(info.used), int(info.free))

    def _utilization(self, handle: object, uuid: str) -> dict[int, int]:
        last = self._last_sample_us.get(uuid, 0)
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, last)
        except (pynvml.NVMLError_NotFound, pynvml.NVMLError_NotSupported):
            return {}  # no sample since `last`
        newest: dict[int, tuple[int, int]] = {}
        for sample in samples:
            if sample.pid == 0 or sample.smUtil > 100 or sample.timeStamp <= last:
                continue
            if sample.pid not in newest or sample.timeStamp > newest[sample.pid][0]:
                newest[sample.pid] = (sample.timeStamp, sample.smUtil)
        if newest:
            self._last_sample_us[uuid] = max(ts for ts, _ in newest.values())
        return {pid: util for pid, (_, util) in newest.items()}

    def compute_mode(self, uuid: str) -> int:
        """The GPU's compute mode (NVML_COMPUTEMODE_*)."""
        with self._lock:
            try:
                self._ensure()
                return int(pynvml.nvmlDeviceGetComputeMode(pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())))
            except pynvml.NVMLError as err:
                self._reset()
                raise NvmlError(f"NVML: reading the compute mode of {uuid}: {err}") from err

    def set_compute_mode(self, uuid: str, mode: int) -> None:
        """nvmlDeviceSetComputeMode (root only; the setting lasts until the driver unloads)."""
        with self._lock:
            try:
                self._ensure()
                pynvml.nvmlDeviceSetComputeMode(pynvml.nvmlDeviceGetHandleByUUID(uuid.encode()), mode)
            except pynvml.NVMLError as err:
                self._reset()
                raise NvmlError(f"NVML: setting compute mode {mode} on {uuid}: {err}") from err

    def set_memory_limits(self, uuid: str, cgroup: str, soft: int, hard: int) -> tuple[int, int]:
        """nvmlDeviceSetMemoryLimits_v1 on a cgroup (CUDA 13.4, r615+), then the limits read back
        (nvmlDeviceGetMemoryLimits_v1): (soft, hard) in bytes, as the driver holds them."""
        with self._lock:
            try:
                self._ensure()
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())
                lib = pynvml.nvmlLib
                if lib is None or not hasattr(lib, "nvmlDeviceSetMemoryLimits_v1"):
                    raise NvmlError("NVML has no nvmlDeviceSetMemoryLimits_v1 (needs driver r615+ and CUDA 13.4)")
                path = cgroup.encode()
                _check(lib.nvmlDeviceSetMemoryLimits_v1(handle, ctypes.byref(_SetLimits(path, soft, hard))))
                got = _GetLimits(path, 0, 0, 0)
                _check(lib.nvmlDeviceGetMemoryLimits_v1(handle, ctypes.byref(got)))
                return int(got.softLimit), int(got.hardLimit)
            except pynvml.NVMLError as err:
                self._reset()
                raise NvmlError(f"NVML: the memory limit of {cgroup} on {uuid}: {err}") from err

    def close(self) -> None:
        with self._lock:
            self._reset()


# ---- critical XID errors, as NVIDIA's device plugin watches them: every GPU NVML lists is registered for
# `nvmlEventTypeXidCriticalError`, and registered again when the GPUs listed change ----
class XidWatch:
    def __init__(self, on_xid: Callable[[str, int], None], listed: Callable[[], tuple[str, ...]],
                 wait_ms: int = 1000, retry_s: float = 5.0) -> None:
        self._on_xid = on_xid
        self._listed = listed  # the GPUs the agent read last (sorted UUIDs): a change registers them again
        self._wait_ms = wait_ms
        self._retry_s = retry_s
        self.watching: tuple[str, ...] = ()  # the GPUs registered now: an XID before its registration is not seen

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self._watch(stop)
            except pynvml.NVMLError as err:
                log.warning("watching the GPUs' XID errors failed, retrying in %.0f s: %s", self._retry_s, err)
                stop.wait(self._retry_s)

    def _watch(self, stop: threading.Event) -> None:
        pynvml.nvmlInit()
        try:
            events = pynvml.nvmlEventSetCreate()
            try:
                registered = self.watching = self._register(events)
                while not stop.is_set() and self._listed() == registered:
                    try:
                        event = pynvml.nvmlEventSetWait(events, self._wait_ms)
                    except pynvml.NVMLError_Timeout:
                        continue
                    self._on_xid(_text(pynvml.nvmlDeviceGetUUID(event.device)), int(event.eventData))
            finally:
                self.watching = ()
                pynvml.nvmlEventSetFree(events)
        finally:
            pynvml.nvmlShutdown()

    @staticmethod
    def _register(events: object) -> tuple[str, ...]:
        uuids = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            try:
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, events)
            except pynvml.NVMLError_NotSupported:
                log.warning("GPU %s reports no XID events: its loss is not seen", uuid)
            uuids.append(uuid)
        return tuple(sorted(uuids))
