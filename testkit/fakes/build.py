"""Builds the fake libnvidia-ml.so.1 from fake_nvml.c (and the fake libcuda.so.1 from fake_cuda.c, which
the GPU check's tests (gpucheck/) and the fake driver root use, and the empty driver libraries of driver_stub.c),
cached by source hash under testkit/fakes/build/.

python -m testkit.fakes.build        # prints the directory to put on LD_LIBRARY_PATH (the fake NVML's)
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

FAKES = Path(__file__).resolve().parent
SOURCE = FAKES / "fake_nvml.c"
BUILD_ROOT = FAKES / "build"
LIBRARY = "libnvidia-ml.so.1"
CUDA_SOURCE = FAKES / "fake_cuda.c"
CUDA_LIBRARY = "libcuda.so.1"
MPS_CONTROL = FAKES / "nvidia-cuda-mps-control"
DRIVER_STUB_SOURCE = FAKES / "driver_stub.c"


class FakeBuildError(RuntimeError):
    """The C compiler is missing or rejected fake_nvml.c."""


def fake_nvml_dir() -> Path:
    """The directory holding a freshly built (or cached) fake libnvidia-ml.so.1."""
    return _built(SOURCE, LIBRARY)


def fake_cuda_library() -> Path:
    """A freshly built (or cached) fake libcuda.so.1."""
    return _built(CUDA_SOURCE, CUDA_LIBRARY) / CUDA_LIBRARY


def driver_stub_library(soname: str) -> Path:
    """An empty shared object whose soname is `soname` (a driver library of the fake driver root)."""
    return _built(DRIVER_STUB_SOURCE, soname) / soname


def _built(source: Path, name: str) -> Path:
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    out_dir = BUILD_ROOT / digest
    library = out_dir / name
    if library.exists():
        return out_dir
    BUILD_ROOT.mkdir(parents=True, exist_ok=True)
    with open(BUILD_ROOT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if library.exists():
            return out_dir
        compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise FakeBuildError(f"no C compiler (cc) found to build the fake {name}")
        out_dir.mkdir(parents=True, exist_ok=True)
        partial = out_dir / f".{name}.{os.getpid()}"
        result = subprocess.run(
            [
                compiler,
                "-shared",
                "-fPIC",
                "-O1",
                "-Wall",
                "-Werror",
                f"-Wl,-soname,{name}",
                "-o",
                str(partial),
                str(source),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise FakeBuildError(f"building {source.name} failed:\n{result.stderr}")
        partial.rename(library)
    return out_dir


def fake_nvml_library() -> Path:
    return fake_nvml_dir() / LIBRARY


if __name__ == "__main__":
    sys.stdout.write(f"{fake_nvml_dir()}\n")
