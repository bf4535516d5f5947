"""The CUDA driver API through ctypes (only in client subprocesses: the parent never creates a context).
Signatures from the CUDA Driver API reference, docs.nvidia.com/cuda/cuda-driver-api; the _v2 names are the symbols
cuda.h maps the plain names to (64-bit CUdeviceptr and size_t sizes)."""

from __future__ import annotations

import ctypes
from typing import Any

CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CUDA_ERROR_OUT_OF_MEMORY = 2  # what a probe's allocation meets at its limit


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
