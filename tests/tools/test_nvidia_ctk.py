"""NVIDIA's container toolkit against gpufrac's GPU fakes: `nvidia-ctk cdi generate` (v1.20.2, built by
e2e/build-nvidia.sh into the tools cache) run on the fake libnvidia-ml.so.1 and the fake driver root
(testkit/fakes/driver_root.py) of four H200s writes the spec a real node with a 615 driver gets: one device per GPU
by index and by UUID, the control devices, the driver's libraries found by the version NVML reports, its hooks and
`NVIDIA_VISIBLE_DEVICES=void`. Everything in it comes from the fake's state file. And nvidia-container-runtime, in
its default mode (jit-cdi on an NVML host), edits a container's OCI spec from the same fakes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from e2e.toolkit.tools import find_binary
from testkit.fakes import driver_root
from testkit.fakes.state import FakeGpuState

pytestmark = pytest.mark.e2e

UUIDS = tuple(f"GPU-c7c0{i}{i}{i}{i}-1111-2222-3333-44444444444{i}" for i in range(4))
LIB = "/usr/lib/x86_64-linux-gnu"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="module")
def binaries() -> dict[str, str]:
    found = {name: find_binary(name) for name in ("nvidia-ctk", "nvidia-cdi-hook", "nvidia-container-runtime")}
    missing = [name for name, path in found.items() if path is None]
    reason = ""
    if missing:
        reason = f"NVIDIA's container toolkit is not built ({', '.join(missing)}): `make tools` (e2e/build-nvidia.sh)"
    elif os.geteuid() != 0:
        reason = "the fake driver root's device nodes need root (mknod)"
    if reason and _in_ci():
        pytest.fail(f"CI is set: {reason}", pytrace=False)
    if reason:
        pytest.skip(reason)
    return {name: path for name, path in found.items() if path}


class Node:
    """Four fake H200s: the fake NVML's state file and a driver root made from it."""

    def __init__(self, tmp: Path, binaries: dict[str, str], driver_version: str = "615.20") -> None:
        self.tmp, self.binaries = tmp, binaries
        self.state = FakeGpuState(tmp / "nvml.json").set(driver_version=driver_version)
        for uuid in UUIDS:
            self.state.gpu(uuid)
        self.driver = driver_root.build(tmp / "driver", self.state.path)
        self.trace = tmp / "nvml-calls"

    def generate(self) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GPUFRAC_FAKE_NVML": str(self.state.path),
               "GPUFRAC_FAKE_NVML_TRACE": str(self.trace)}
        return subprocess.run(
            [self.binaries["nvidia-ctk"], "cdi", "generate", "--format=json", f"--driver-root={self.driver.path}",
             f"--dev-root={self.driver.path}", "--device-name-strategy=index", "--device-name-strategy=uuid",
             f"--nvidia-cdi-hook-path={self.binaries['nvidia-cdi-hook']}"],
            capture_output=True, text=True, timeout=120, env=env, check=False)

    def spec(self) -> dict[str, Any]:
        result = self.generate()
        assert result.returncode == 0, result.stderr[-3000:]
        spec: dict[str, Any] = json.loads(result.stdout)
        return spec


@pytest.fixture
def node(tmp_path: Path, binaries: dict[str, str]) -> Node:
    return Node(tmp_path, binaries)


def hooks(edits: dict[str, Any]) -> dict[str, list[str]]:
    """The hooks of some container edits by nvidia-cdi-hook subcommand: their arguments."""
    return {h["args"][1]: h["args"][2:] for h in edits.get("hooks", [])}


def test_one_device_per_fake_gpu_by_index_and_by_uuid_with_its_device_node(node: Node) -> None:
    spec = node.spec()
    assert spec["kind"] == "nvidia.com/gpu"
    devices = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    assert set(devices) == {"0", "1", "2", "3", *UUIDS, "all"}
    for index, uuid in enumerate(UUIDS):
        assert devices[str(index)] == devices[uuid]
        [gpu] = devices[uuid]["deviceNodes"]
        assert (gpu["path"], gpu["hostPath"], gpu["major"], gpu.get("minor", 0)) == (
            f"/dev/nvidia{index}", str(node.driver.gpu_device(index)), 195, index)
        # v1.20's per-GPU hook: the CUDA memory limit on the container's cgroup, keyed by the GPU's UUID.
        assert hooks(devices[uuid])["apply-cuda-memory-limits"] == [
            "--driver-root", str(node.driver.path), "--gpu-id", uuid]
    assert [n["path"] for n in devices["all"]["deviceNodes"]] == [f"/dev/nvidia{i}" for i in range(4)]
    # What the toolkit asked the fake NVML (any call the fake lacks would have killed nvidia-ctk instead).
    calls = set(node.trace.read_text().split())
    assert {"nvmlDeviceGetHandleByUUID", "nvmlDeviceGetMinorNumber", "nvmlDeviceGetPciInfo_v3",
            "nvmlDeviceGetMigMode", "nvmlSystemGetDriverVersion"} <= calls


def test_every_device_gets_the_control_devices_the_driver_libraries_and_a_void_visible_devices(node: Node) -> None:
    common = node.spec()["containerEdits"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in common["env"]
    assert f"NVIDIA_CTK_LIBCUDA_DIR={LIB}" in common["env"]
    control = {n["path"]: (n["hostPath"], n["major"], n.get("minor", 0)) for n in common["deviceNodes"]}
    root = node.driver.path
    assert control == {"/dev/nvidiactl": (str(root / "dev/nvidiactl"), 195, 255),
                       "/dev/nvidia-modeset": (str(root / "dev/nvidia-modeset"), 195, 254),
                       "/dev/nvidia-uvm": (str(root / "dev/nvidia-uvm"), driver_root.UVM_MAJOR, 0),
                       "/dev/nvidia-uvm-tools": (str(root / "dev/nvidia-uvm-tools"), driver_root.UVM_MAJOR, 1)}
    mounts = {m["containerPath"]: m["hostPath"] for m in common["mounts"]}
    for name, _ in driver_root.LIBRARIES:  # every library of the install, by the version NVML reports
        assert mounts[f"{LIB}/{name}.so.615.20"] == str(node.driver.library(name))
    assert mounts["/usr/bin/nvidia-cuda-mps-control"] == str(root / "usr/bin/nvidia-cuda-mps-control")
    assert mounts["/lib/firmware/nvidia/615.20/gsp_ga10x.bin"] == str(root / "lib/firmware/nvidia/615.20/gsp_ga10x.bin")


def test_the_hooks_link_the_libraries_by_soname_update_the_ld_cache_and_use_the_built_hook(node: Node) -> None:
    common = node.spec()["containerEdits"]
    assert {h["path"] for h in common["hooks"]} == {node.binaries["nvidia-cdi-hook"]}
    assert {h["hookName"] for h in common["hooks"]} == {"createContainer"}
    found = hooks(common)
    links = set(found["create-symlinks"][1::2])
    assert {f"libcuda.so.615.20::{LIB}/libcuda.so.1", f"libnvidia-ml.so.615.20::{LIB}/libnvidia-ml.so.1",
            f"libnvidia-nvvm.so.615.20::{LIB}/libnvidia-nvvm.so.4", f"libcuda.so.1::{LIB}/libcuda.so"} <= links
    assert found["update-ldcache"] == ["--folder", LIB]
    assert found["enable-cuda-compat"] == ["--host-driver-version=615.20"]
    assert "disable-device-node-modification" in found


def test_the_driver_version_in_the_state_file_is_the_one_the_spec_mounts(tmp_path: Path,
                                                                       binaries: dict[str, str]) -> None:
    node = Node(tmp_path, binaries, driver_version="580.95.05")
    common = node.spec()["containerEdits"]
    mounted = {m["containerPath"] for m in common["mounts"]}
    assert f"{LIB}/libcuda.so.580.95.05" in mounted
    assert not any("615" in path for path in mounted)
    assert hooks(common)["enable-cuda-compat"] == ["--host-driver-version=580.95.05"]


def test_a_gpu_the_state_file_gives_no_minor_number_fails_the_generation_loudly(node: Node) -> None:
    node.state.state["gpus"][2].pop("minor_number")
    node.state.write()
    result = node.generate()
    assert result.returncode != 0
    assert "minor number: Not Supported" in result.stderr


class Runtime:
    """nvidia-container-runtime with NVIDIA's default config (mode `auto`) but for the node's paths, wrapping a
    stand-in low-level runtime that keeps the OCI spec it was handed: what runc would have created."""

    def __init__(self, node: Node, driver: Path) -> None:
        self.node, self.bundle = node, node.tmp / "bundle"
        (self.bundle / "rootfs").mkdir(parents=True)
        self.handed = node.tmp / "handed.json"
        lowlevel = node.tmp / "lowlevel"
        lowlevel.write_text(f"#!/bin/sh\ncp {self.bundle}/config.json {self.handed}\n")
        lowlevel.chmod(0o755)
        self.config = node.tmp / "toolkit.toml"
        ctk = node.binaries["nvidia-ctk"]
        subprocess.run([ctk, "config", "default", f"--output={self.config}"], check=True, capture_output=True)
        subprocess.run([ctk, "config", f"--config-file={self.config}", "--in-place",
                        "--set", f"nvidia-container-runtime.runtimes={lowlevel}",
                        "--set", f"nvidia-container-cli.root={driver}", "--set", f"nvidia-ctk.path={ctk}"],
                       check=True, capture_output=True)

    def create(self, env: list[str]) -> dict[str, Any]:
        """The OCI spec runc would get for a container with `env`."""
        spec = {"ociVersion": "1.2.0", "process": {"env": env, "cwd": "/", "args": ["sh"]},
                "root": {"path": "rootfs"}, "linux": {}}
        (self.bundle / "config.json").write_text(json.dumps(spec))
        self.handed.unlink(missing_ok=True)
        result = subprocess.run(
            [self.node.binaries["nvidia-container-runtime"], "create", "--bundle", str(self.bundle), "ctr"],
            env={"PATH": f"{Path(self.node.binaries['nvidia-ctk']).parent}:{os.environ.get('PATH', '/usr/bin')}",
                 "NVIDIA_CTK_CONFIG_FILE_PATH": str(self.config), "GPUFRAC_FAKE_NVML": str(self.node.state.path)},
            capture_output=True, text=True, timeout=120, check=False)
        assert result.returncode == 0, result.stderr[-3000:]
        handed: dict[str, Any] = json.loads(self.handed.read_text())
        return handed


def gpu_nodes(oci: dict[str, Any]) -> list[str]:
    return [d["path"] for d in oci["linux"].get("devices", []) if d["path"].removeprefix("/dev/nvidia").isdigit()]


def test_the_runtime_gives_a_container_the_gpu_its_env_names_and_a_legacy_cuda_image_all(node: Node) -> None:
    runtime = Runtime(node, node.driver.path)
    one = runtime.create(["PATH=/bin", f"NVIDIA_VISIBLE_DEVICES={UUIDS[2]}"])
    assert gpu_nodes(one) == ["/dev/nvidia2"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in one["process"]["env"]
    assert f"{LIB}/libcuda.so.615.20" in {m["destination"] for m in one["mounts"]}
    # NVIDIA_VISIBLE_DEVICES unset and CUDA_VERSION set: NVIDIA's runtime reads a legacy CUDA image as asking for all.
    legacy = runtime.create(["PATH=/bin", "CUDA_VERSION=13.0.2"])
    assert gpu_nodes(legacy) == [f"/dev/nvidia{i}" for i in range(4)]
    assert gpu_nodes(runtime.create(["PATH=/bin"])) == []


def test_the_runtime_finds_device_nodes_under_its_driver_root_only(node: Node) -> None:
    """It has no dev root of its own (`nvidia-container-cli.root` is both): a driver root without dev/ gets a
    container no GPU, silently; one whose dev/ links to where the nodes are gets them."""
    bare = driver_root.build(node.tmp / "bare", node.state.path, device_nodes=False)
    assert gpu_nodes(Runtime(node, bare.path).create(["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"])) == []
    linked = driver_root.build(node.tmp / "linked", node.state.path, device_nodes=False,
                               dev_link=node.driver.path / "dev")
    node.tmp.joinpath("bundle").rename(node.tmp / "bundle-bare")
    assert gpu_nodes(Runtime(node, linked.path).create(["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"])) == ["/dev/nvidia0"]
