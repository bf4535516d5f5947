"""A fake NVIDIA driver root: the files a driver install has, laid out where NVIDIA's container toolkit looks, for
`nvidia-ctk cdi generate --driver-root <root> --dev-root <root>` and NVIDIA's device plugin to run against.

Everything is read from the fake NVML's state file (testkit/fakes/state.py), so the root matches what the fake
libnvidia-ml.so.1 in it reports:

- `usr/lib/x86_64-linux-gnu/`: each library as `<name>.so.<driver_version>` (the toolkit finds the driver's
  libraries by the version NVML reports), with the soname link a driver install makes (`libcuda.so.1` ->
  `libcuda.so.615.20`) and `libcuda.so`. libnvidia-ml is the fake NVML itself, libcuda the fake libcuda.so.1
  (fake_cuda.c); every other library is an empty shared object with the real soname (driver_stub.c), so a call
  into it fails loudly. No libnvidia-sandboxutils: the toolkit would call into it instead of NVML.
- `usr/bin/`: nvidia-cuda-mps-control (the fake MPS control), and nvidia-smi, nvidia-persistenced and
  nvidia-cuda-mps-server, which say they are not faked and fail.
- `lib/firmware/nvidia/<driver_version>/gsp_*.bin`: the GSP firmware files (a few bytes each).
- `dev/`: character devices with a driver's numbers: `nvidia<minor>` (195:<minor>) per GPU, `nvidiactl`
  (195:255), `nvidia-modeset` (195:254), `nvidia-uvm` and `nvidia-uvm-tools` (the uvm driver's dynamic major,
  510 here). Making them needs root; nothing opens them (no driver behind them: an open fails with ENXIO).

python -m testkit.fakes.driver_root ROOT STATE_FILE    # builds ROOT, prints it
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.fakes.build import MPS_CONTROL, driver_stub_library, fake_cuda_library, fake_nvml_library

LIB_DIR = Path("usr/lib/x86_64-linux-gnu")
BIN_DIR = Path("usr/bin")
NVIDIA_MAJOR = 195
CTL_MINOR = 255
MODESET_MINOR = 254
UVM_MAJOR = 510  # dynamic on a real machine (/proc/devices names it); any free number does for a fake
# (library, its soname); "{version}" stands for the driver version. The compute and video libraries of a
# server driver install.
LIBRARIES = (
    ("libcuda", "libcuda.so.1"),
    ("libnvidia-ml", "libnvidia-ml.so.1"),
    ("libcudadebugger", "libcudadebugger.so.1"),
    ("libnvidia-ptxjitcompiler", "libnvidia-ptxjitcompiler.so.1"),
    ("libnvidia-nvvm", "libnvidia-nvvm.so.4"),
    ("libnvidia-opencl", "libnvidia-opencl.so.1"),
    ("libnvidia-allocator", "libnvidia-allocator.so.1"),
    ("libnvidia-cfg", "libnvidia-cfg.so.1"),
    ("libnvidia-gpucomp", "libnvidia-gpucomp.so.{version}"),
    ("libnvidia-pkcs11-openssl3", "libnvidia-pkcs11-openssl3.so.{version}"),
    ("libnvidia-encode", "libnvidia-encode.so.1"),
    ("libnvcuvid", "libnvcuvid.so.1"),
)
UNFAKED_BINARIES = ("nvidia-smi", "nvidia-persistenced", "nvidia-cuda-mps-server")
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")


class DriverRootError(RuntimeError):
    """The state file cannot describe a driver root, or the root cannot be made here."""


@dataclass(frozen=True)
class DriverRoot:
    path: Path
    version: str
    minors: tuple[int, ...]

    @property
    def lib_dir(self) -> Path:
        return self.path / LIB_DIR

    def library(self, name: str) -> Path:
        """`libcuda` -> <root>/usr/lib/x86_64-linux-gnu/libcuda.so.<version>"""
        return self.lib_dir / f"{name}.so.{self.version}"

    def gpu_device(self, minor: int) -> Path:
        return self.path / "dev" / f"nvidia{minor}"


def read_state(state_file: Path) -> tuple[str, tuple[int, ...]]:
    """The driver version and the GPUs' minor numbers the fake NVML will report."""
    try:
        state: Any = json.loads(state_file.read_text())
    except (OSError, ValueError) as exc:
        raise DriverRootError(f"cannot read the fake NVML state {state_file}: {exc}") from None
    version = state.get("driver_version") if isinstance(state, dict) else None
    if not isinstance(version, str) or not version:
        raise DriverRootError(f"{state_file} has no driver_version")
    minors = []
    for i, gpu in enumerate(state.get("gpus", [])):
        minor = gpu.get("minor_number") if isinstance(gpu, dict) else None
        if not isinstance(minor, int) or minor < 0:
            raise DriverRootError(f"{state_file}: GPU {i} has no minor_number (its /dev/nvidia<minor>)")
        minors.append(minor)
    return version, tuple(minors)


def build(root: Path, state_file: Path, *, device_nodes: bool = True, dev_link: Path | None = None) -> DriverRoot:
    """Make (or remake) the driver root at `root` for the GPUs of `state_file`. `dev_link`: `<root>/dev` is a link to
    that directory instead (the host's /dev where a harness made the device nodes): nvidia-container-runtime looks
    for device nodes under its driver root (`nvidia-container-cli.root`), with no separate dev root."""
    if dev_link is not None and device_nodes:
        raise DriverRootError("a driver root either makes its device nodes or links dev/ to a directory, not both")
    version, minors = read_state(state_file)
    driver = DriverRoot(root, version, minors)
    _libraries(driver)
    _binaries(root / BIN_DIR)
    firmware = root / "lib/firmware/nvidia" / version
    firmware.mkdir(parents=True, exist_ok=True)
    for name in FIRMWARE:
        (firmware / name).write_bytes(b"fake GSP firmware\n")
    if device_nodes:
        _devices(driver)
    elif dev_link is not None:
        if (root / "dev").is_dir() and not (root / "dev").is_symlink():
            shutil.rmtree(root / "dev")
        _replace(root / "dev")
        (root / "dev").symlink_to(dev_link)
    return driver


def _replace(path: Path) -> None:
    if path.is_symlink() or path.exists():
        path.unlink()


def _libraries(driver: DriverRoot) -> None:
    driver.lib_dir.mkdir(parents=True, exist_ok=True)
    for name, soname_pattern in LIBRARIES:
        soname = soname_pattern.format(version=driver.version)
        target = driver.library(name)
        if name == "libnvidia-ml":
            source = fake_nvml_library()
        elif name == "libcuda":
            source = fake_cuda_library()
        else:
            source = driver_stub_library(soname)
        _replace(target)
        shutil.copyfile(source, target)
        target.chmod(0o755)
        if soname != target.name:
            _replace(driver.lib_dir / soname)
            (driver.lib_dir / soname).symlink_to(target.name)
    _replace(driver.lib_dir / "libcuda.so")
    (driver.lib_dir / "libcuda.so").symlink_to("libcuda.so.1")


def _binaries(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    _replace(bin_dir / "nvidia-cuda-mps-control")
    shutil.copyfile(MPS_CONTROL, bin_dir / "nvidia-cuda-mps-control")
    (bin_dir / "nvidia-cuda-mps-control").chmod(0o755)
    for name in UNFAKED_BINARIES:
        path = bin_dir / name
        _replace(path)
        path.write_text(f"#!/bin/sh\necho '{name}: not faked (gpufrac fake driver root)' >&2\nexit 1\n")
        path.chmod(0o755)


def _devices(driver: DriverRoot) -> None:
    if os.geteuid() != 0:
        raise DriverRootError("making the fake driver root's device nodes (mknod) needs root")
    dev = driver.path / "dev"
    dev.mkdir(parents=True, exist_ok=True)
    nodes = {f"nvidia{minor}": (NVIDIA_MAJOR, minor) for minor in driver.minors}
    nodes |= {"nvidiactl": (NVIDIA_MAJOR, CTL_MINOR), "nvidia-modeset": (NVIDIA_MAJOR, MODESET_MINOR),
              "nvidia-uvm": (UVM_MAJOR, 0), "nvidia-uvm-tools": (UVM_MAJOR, 1)}
    for stale in dev.glob("nvidia*"):
        if stale.name not in nodes:
            stale.unlink()
    for name, (major, minor) in nodes.items():
        path = dev / name
        _replace(path)
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        path.chmod(0o666)  # mknod honours the umask


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write("usage: python -m testkit.fakes.driver_root ROOT STATE_FILE\n")
        return 2
    try:
        driver = build(Path(argv[0]).resolve(), Path(argv[1]))
    except DriverRootError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    sys.stdout.write(f"{driver.path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
