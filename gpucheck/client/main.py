"""One CUDA client: its cgroup and pod, its context (through MPS when its pipe directory has a daemon), and the work
its spec names (calibrate, probe, allocate, spin)."""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any

from gpucheck.client.allocations import PLAIN, give_back, probe
from gpucheck.client.kernel import Kernel, calibrate
from gpucheck.client.pod import enter_pod
from gpucheck.client.protocol import emit, wait_word
from gpucheck.contract import MIB
from gpucheck.cuda import (
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    Cuda,
    CudaError,
)


def join_cgroup(path: str) -> None:
    with open(os.path.join(path, "cgroup.procs"), "w") as procs:
        procs.write(str(os.getpid()))


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
    result = client_work(spec, cuda, kernel, device.value)
    allocator = result.pop("allocator", None)  # the probe's, which gives its chunks back after `release`
    emit(event="result", **result)
    if spec.get("hold"):
        stage[0] = "hold"
        wait_word("release", spec.get("hold_timeout", 120))
    if allocator is not None:
        give_back(allocator, result["probe"]["chunks"])
    cuda.call("cuDevicePrimaryCtxRelease_v2", device)


def client_work(spec: dict[str, Any], cuda: Cuda, kernel: Kernel, device: int) -> dict[str, Any]:
    result: dict[str, Any] = {"t_go": time.time()}
    if spec.get("action") == "calibrate":
        result.update(calibrate(kernel, spec["target_s"]))
    if "probe_max_mib" in spec:  # allocate the spec's way (probe_kind) until refused
        kind = spec.get("probe_kind", PLAIN)
        result["probe"], result["allocator"] = probe(cuda, device, spec["probe_max_mib"], kind)
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
