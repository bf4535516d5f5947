"""The fake NVIDIA driver root (testkit/fakes/driver_root.py): laid out from the fake NVML's state file, its
libraries named by the driver version the fake reports, the fake NVML and libcuda in it, every other library an
empty object with the real soname whose calls fail loudly."""

from __future__ import annotations

import ctypes
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from testkit import REPO_ROOT
from testkit.fakes import driver_root
from testkit.fakes.build import fake_nvml_library
from testkit.fakes.state import FakeGpuState


@pytest.fixture
def state(tmp_path: Path) -> FakeGpuState:
    gpus = FakeGpuState(tmp_path / "nvml.json").set(driver_version="580.95.05")
    for i in range(3):
        gpus.gpu(f"GPU-0000000{i}-0000-0000-0000-000000000000")
    return gpus


def test_the_libraries_carry_the_version_the_fake_nvml_reports_and_their_soname_links(tmp_path: Path,
                                                                                     state: FakeGpuState) -> None:
    driver = driver_root.build(tmp_path / "root", state.path, device_nodes=False)
    assert driver.version == "580.95.05" and driver.minors == (0, 1, 2)
    lib = driver.lib_dir
    versioned = sorted(p.name for p in lib.iterdir() if not p.is_symlink())
    assert versioned == sorted(f"{name}.so.580.95.05" for name, _ in driver_root.LIBRARIES)
    assert os.readlink(lib / "libcuda.so.1") == "libcuda.so.580.95.05"
    assert os.readlink(lib / "libcuda.so") == "libcuda.so.1"
    assert os.readlink(lib / "libnvidia-nvvm.so.4") == "libnvidia-nvvm.so.580.95.05"
    assert driver.library("libnvidia-ml").read_bytes() == fake_nvml_library().read_bytes()
    assert (tmp_path / "root/lib/firmware/nvidia/580.95.05/gsp_ga10x.bin").is_file()
    assert os.access(tmp_path / "root/usr/bin/nvidia-cuda-mps-control", os.X_OK)
    assert not (tmp_path / "root/dev").exists()


def test_a_library_gpufrac_does_not_fake_has_its_soname_and_no_functions(tmp_path: Path,
                                                                         state: FakeGpuState) -> None:
    driver = driver_root.build(tmp_path / "root", state.path, device_nodes=False)
    dynamic = subprocess.run(["objdump", "-p", str(driver.library("libnvidia-ptxjitcompiler"))],
                             capture_output=True, text=True, check=True).stdout
    assert "SONAME               libnvidia-ptxjitcompiler.so.1" in dynamic
    stub = ctypes.CDLL(str(driver.library("libnvidia-ptxjitcompiler")))
    with pytest.raises(AttributeError, match="undefined symbol"):  # the real library's JIT entry point
        getattr(stub, "__cuda_CallJitEntryPoint")
    unfaked = subprocess.run([str(tmp_path / "root/usr/bin/nvidia-smi")], capture_output=True, text=True)
    assert unfaked.returncode == 1 and "not faked" in unfaked.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_device_nodes_carry_a_drivers_numbers_for_each_gpus_minor(tmp_path: Path, state: FakeGpuState) -> None:
    state.state["gpus"][2]["minor_number"] = 7  # a GPU's minor is not its index on every board
    state.write()
    driver = driver_root.build(tmp_path / "root", state.path)
    dev = tmp_path / "root/dev"
    numbers = {p.name: (os.major(p.stat().st_rdev), os.minor(p.stat().st_rdev)) for p in dev.iterdir()
               if stat.S_ISCHR(p.stat().st_mode)}
    assert numbers == {"nvidia0": (195, 0), "nvidia1": (195, 1), "nvidia7": (195, 7), "nvidiactl": (195, 255),
                       "nvidia-modeset": (195, 254), "nvidia-uvm": (driver_root.UVM_MAJOR, 0),
                       "nvidia-uvm-tools": (driver_root.UVM_MAJOR, 1)}
    assert driver.gpu_device(7) == dev / "nvidia7"


def test_dev_can_link_to_where_a_harness_made_the_nodes(tmp_path: Path, state: FakeGpuState) -> None:
    driver_root.build(tmp_path / "root", state.path, device_nodes=False, dev_link=Path("/dev"))
    assert os.readlink(tmp_path / "root/dev") == "/dev"
    with pytest.raises(driver_root.DriverRootError, match="not both"):
        driver_root.build(tmp_path / "root", state.path, dev_link=Path("/dev"))


@pytest.mark.parametrize(("content", "message"), [
    ('{"gpus": []}', "has no driver_version"),
    ('{"driver_version": "615.20", "gpus": [{"uuid": "GPU-1"}]}', "GPU 0 has no minor_number"),
    ("{not json", "cannot read the fake NVML state"),
])
def test_a_state_file_that_cannot_describe_a_driver_is_a_one_line_error(tmp_path: Path, content: str,
                                                                        message: str) -> None:
    (tmp_path / "nvml.json").write_text(content)
    result = subprocess.run([sys.executable, "-m", "testkit.fakes.driver_root", str(tmp_path / "root"),
                             str(tmp_path / "nvml.json")], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1
