"""The spin kernel in a client: loaded from PTX, launched, timed, and calibrated to run a given time alone."""

from __future__ import annotations

import ctypes
import time
from typing import Any

from gpucheck.cuda import Cuda, CudaError
from gpucheck.ptx import KERNEL_NAME, ptx_candidates, ptx_source


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
