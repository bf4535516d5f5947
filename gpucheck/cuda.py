"""The CUDA driver API through ctypes (only in client subprocesses: the parent never creates a context).
Signatures from the CUDA Driver API reference, docs.nvidia.com/cuda/cuda-driver-api; the _v2 names are the symbols
cuda.h maps the plain names to (64-bit CUdeviceptr and size_t sizes)."""

from __future__ import annotations

import ctypes
from typing import Any

CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102  # cuMemAddressReserve, cuMemCreate, cuMemMap...
CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115  # cuMemAllocAsync and the cuMemPool family
CUDA_ERROR_OUT_OF_MEMORY = 2  # what a probe's allocation meets at its limit
CUDA_ERROR_NOT_SUPPORTED = 801
# cuda.h's enums for the virtual memory management (VMM) calls
CU_MEM_ALLOCATION_TYPE_PINNED = 0x1  # CUmemAllocationType: memory that stays resident on the device
CU_MEM_HANDLE_TYPE_NONE = 0x0  # CUmemAllocationHandleType: no shareable handle asked
CU_MEM_LOCATION_TYPE_DEVICE = 0x1  # CUmemLocationType: `id` is a device ordinal
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3  # CUmemAccess_flags
CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0  # CUmemAllocationGranularity_flags


class CUmemLocation(ctypes.Structure):
    """cuda.h's CUmemLocation_st { CUmemLocationType type; int id; } (in CUDA 13 `id` shares a 4-byte union with
    {unsigned char deviceId, localityDomainId}: the same layout)."""

    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class CUmemAllocFlags(ctypes.Structure):
    """CUmemAllocationProp_st's anonymous `allocFlags` struct."""

    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class CUmemAllocationProp(ctypes.Structure):
    """cuda.h's CUmemAllocationProp_st (CUmemAllocationProp_v1): 32 bytes on 64-bit Linux."""

    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", CUmemLocation),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", CUmemAllocFlags)]


class CUmemAccessDesc(ctypes.Structure):
    """cuda.h's CUmemAccessDesc_st { CUmemLocation location; CUmemAccess_flags flags; }."""

    _fields_ = [("location", CUmemLocation), ("flags", ctypes.c_int)]


def device_memory(device: int) -> tuple[CUmemAllocationProp, CUmemAccessDesc]:
    """What cuMemCreate is asked for (pinned memory on `device`, no shareable handle), and the read-write access
    cuMemSetAccess gives that device to a mapping."""
    prop = CUmemAllocationProp(type=CU_MEM_ALLOCATION_TYPE_PINNED, requestedHandleTypes=CU_MEM_HANDLE_TYPE_NONE,
                               location=CUmemLocation(CU_MEM_LOCATION_TYPE_DEVICE, device))
    access = CUmemAccessDesc(location=CUmemLocation(CU_MEM_LOCATION_TYPE_DEVICE, device),
                             flags=CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    return prop, access


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
        self._declare_pools_and_vmm()
        self._declare("cuModuleLoadData", [p(c_void_p), c_void_p])  # (CUmodule *module, const void *image)
        self._declare("cuModuleGetFunction", [p(c_void_p), c_void_p, ctypes.c_char_p])  # (*hfunc, hmod, name)
        # cuLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
        #                hStream, void **kernelParams, void **extra): kernelParams[i] points at parameter i.
        self._declare("cuLaunchKernel", [c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint,
                                         c_void_p, p(c_void_p), p(c_void_p)])
        self.lib.cuGetErrorName.argtypes = [c_int, p(ctypes.c_char_p)]  # (CUresult error, const char **pStr)
        self.lib.cuGetErrorName.restype = c_int

    def _declare_pools_and_vmm(self) -> None:
        """The allocations other than cuMemAlloc: stream-ordered pools (cudaMallocAsync) and virtual memory
        management (cuMemCreate, what NCCL's buffers use with NCCL_CUMEM_ENABLE), as cuda.h declares them."""
        c_size_t, c_ulonglong, c_void_p, c_int = ctypes.c_size_t, ctypes.c_ulonglong, ctypes.c_void_p, ctypes.c_int
        c_devptr = c_handle = c_ulonglong  # CUdeviceptr_v2; CUmemGenericAllocationHandle_v1: unsigned long long
        p = ctypes.POINTER
        # cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream): from the pool current for the
        # stream's device (the device's default pool unless cuDeviceSetMemPool changed it); stream 0: the legacy one
        self._declare("cuMemAllocAsync", [p(c_devptr), c_size_t, c_void_p])
        self._declare("cuMemFreeAsync", [c_devptr, c_void_p])  # (CUdeviceptr dptr, CUstream hStream)
        self._declare("cuStreamSynchronize", [c_void_p])  # (CUstream hStream)
        # cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
        #                               CUmemAllocationGranularity_flags option)
        self._declare("cuMemGetAllocationGranularity", [p(c_size_t), p(CUmemAllocationProp), c_int])
        # cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
        #             unsigned long long flags): the physical memory, flags 0
        self._declare("cuMemCreate", [p(c_handle), c_size_t, p(CUmemAllocationProp), c_ulonglong])
        # cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
        #                     unsigned long long flags): a virtual address range, no memory
        self._declare("cuMemAddressReserve", [p(c_devptr), c_size_t, c_size_t, c_devptr, c_ulonglong])
        # cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
        #          unsigned long long flags)
        self._declare("cuMemMap", [c_devptr, c_size_t, c_size_t, c_handle, c_ulonglong])
        # cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
        self._declare("cuMemSetAccess", [c_devptr, c_size_t, p(CUmemAccessDesc), c_size_t])
        self._declare("cuMemUnmap", [c_devptr, c_size_t])  # (CUdeviceptr ptr, size_t size)
        self._declare("cuMemAddressFree", [c_devptr, c_size_t])  # (CUdeviceptr ptr, size_t size)
        self._declare("cuMemRelease", [c_handle])  # (CUmemGenericAllocationHandle handle)

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
