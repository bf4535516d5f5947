"""The probes' ways to allocate device memory: cuMemAlloc (what cudaMalloc calls), virtual memory management
(cuMemCreate's physical memory mapped into a reserved range: how NCCL allocates its buffers with NCCL_CUMEM_ENABLE,
PyTorch's expandable segments, JAX's and RAPIDS' VMM pools) and the device's default stream-ordered pool
(cuMemAllocAsync, what cudaMallocAsync calls). Each allocates one chunk, touches it (cuMemsetD8 works on a mapped
range as on any device pointer) and says how to give it back; `probe` allocates in chunks until the first failure."""

from __future__ import annotations

import ctypes
from typing import Any

from gpucheck.contract import MIB
from gpucheck.cuda import (
    CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
    CU_MEM_ALLOC_GRANULARITY_MINIMUM,
    CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_OUT_OF_MEMORY,
    Cuda,
    device_memory,
)

PLAIN, VMM, POOL = "alloc", "vmm", "pool"  # a probe's `kind`
SUPPORT = {VMM: ("CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED",
                 CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED),
           POOL: ("CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED", CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)}

class Plain:
    """cuMemAlloc_v2, freed by cuMemFree_v2 (or with the context)."""

    def __init__(self, cuda: Cuda, device: int) -> None:
        self.cuda = cuda

    def allocate(self, size: int) -> tuple[int, Any]:
        ptr = ctypes.c_ulonglong()
        code = self.cuda.call("cuMemAlloc_v2", ctypes.byref(ptr), size)
        if code != 0:
            return code, None
        self.cuda.check("cuMemsetD8_v2", ptr, 0x5A, size)
        return 0, ptr.value

    def free(self, chunk: Any) -> None:
        self.cuda.call("cuMemFree_v2", chunk)


class Vmm:
    """One chunk: a virtual range (cuMemAddressReserve), physical memory (cuMemCreate) mapped into it (cuMemMap),
    read-write for the device (cuMemSetAccess); given back in the reverse order."""

    def __init__(self, cuda: Cuda, device: int) -> None:
        self.cuda = cuda
        self.prop, self.access = device_memory(device)
        granularity = ctypes.c_size_t()
        cuda.check("cuMemGetAllocationGranularity", ctypes.byref(granularity), ctypes.byref(self.prop),
                   CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        self.granularity = granularity.value or 1

    def allocate(self, size: int) -> tuple[int, Any]:
        size = -(-size // self.granularity) * self.granularity
        cuda, va, handle = self.cuda, ctypes.c_ulonglong(), ctypes.c_ulonglong()
        code = cuda.call("cuMemAddressReserve", ctypes.byref(va), size, self.granularity, 0, 0)
        if code != 0:
            return code, None
        code = cuda.call("cuMemCreate", ctypes.byref(handle), size, ctypes.byref(self.prop), 0)
        if code != 0:
            cuda.call("cuMemAddressFree", va, size)
            return code, None
        code = cuda.call("cuMemMap", va, size, 0, handle, 0)
        if code == 0:
            code = cuda.call("cuMemSetAccess", va, size, ctypes.byref(self.access), 1)
            if code != 0:
                cuda.call("cuMemUnmap", va, size)
        if code != 0:
            cuda.call("cuMemRelease", handle)
            cuda.call("cuMemAddressFree", va, size)
            return code, None
        cuda.check("cuMemsetD8_v2", va, 0x5A, size)
        return 0, (va.value, size, handle.value)

    def free(self, chunk: Any) -> None:
        va, size, handle = chunk
        self.cuda.call("cuMemUnmap", va, size)
        self.cuda.call("cuMemRelease", handle)
        self.cuda.call("cuMemAddressFree", va, size)


class Pool:
    """cuMemAllocAsync on stream 0 (the legacy default stream) from the device's default pool, synchronized;
    cuMemFreeAsync gives it back to the pool (whose release threshold, 0 by default, returns it to the device at the
    next synchronization)."""

    def __init__(self, cuda: Cuda, device: int) -> None:
        self.cuda = cuda

    def allocate(self, size: int) -> tuple[int, Any]:
        ptr = ctypes.c_ulonglong()
        code = self.cuda.call("cuMemAllocAsync", ctypes.byref(ptr), size, None)
        if code == 0:
            code = self.cuda.call("cuStreamSynchronize", None)
        if code != 0:
            return code, None
        self.cuda.check("cuMemsetD8_v2", ptr, 0x5A, size)
        return 0, ptr.value

    def free(self, chunk: Any) -> None:
        self.cuda.call("cuMemFreeAsync", chunk, None)
        self.cuda.call("cuStreamSynchronize", None)


KINDS: dict[str, Any] = {PLAIN: Plain, VMM: Vmm, POOL: Pool}


def unsupported(cuda: Cuda, device: int, kind: str) -> str | None:
    """Why this device cannot allocate this way (its attribute is 0, or the driver does not know it), or None."""
    if kind not in SUPPORT:
        return None
    name, attribute = SUPPORT[kind]
    value = ctypes.c_int()
    code = cuda.call("cuDeviceGetAttribute", ctypes.byref(value), attribute, device)
    if code != 0:
        return f"{name}: {cuda.error_name(code)}"
    return None if value.value else f"{name} is 0"


def probe(cuda: Cuda, device: int, max_mib: int, kind: str = PLAIN, chunk_mib: int = 64, fine_mib: int = 4
          ) -> tuple[dict[str, Any], Any]:
    """Allocates (and touches) chunks the `kind` way until the first failure, then smaller chunks up to the edge;
    keeps them. The probe's numbers (stopped_by "unsupported" where the device does not allocate that way), and the
    allocator that frees its chunks."""
    why = unsupported(cuda, device, kind)
    if why:
        return {"kind": kind, "allocated_mib": 0, "stopped_by": "unsupported", "chunks": [], "error_name": why,
                "error_code": None}, None
    allocator = KINDS[kind](cuda, device)
    chunks: list[Any] = []
    allocated = 0
    failed: int | None = None  # the CUresult that ended the last phase; None: it reached max_mib
    for size in (chunk_mib, fine_mib):
        failed = None
        while allocated + size <= max_mib:
            code, chunk = allocator.allocate(size * MIB)  # (CUresult, the chunk; None when refused)
            if code != 0:
                failed = code
                break
            chunks.append(chunk)
            allocated += size
        if failed is not None and failed != CUDA_ERROR_OUT_OF_MEMORY:
            break
    cuda.check("cuCtxSynchronize")
    stopped_by = ("max" if failed is None else "oom" if failed == CUDA_ERROR_OUT_OF_MEMORY
                  else "unsupported" if failed == CUDA_ERROR_NOT_SUPPORTED and not chunks else "error")
    return {"kind": kind, "allocated_mib": allocated, "stopped_by": stopped_by, "chunks": chunks,
            "error_name": None if failed is None else cuda.error_name(failed), "error_code": failed}, allocator


def give_back(allocator: Any, chunks: list[Any]) -> None:
    """Frees a probe's chunks, newest first, as a program that cleans up does before its context goes."""
    for chunk in reversed(chunks):
        allocator.free(chunk)
