"""NVIDIA's device plugin (k8s-device-plugin v0.18.0, built by e2e/build-nvidia.sh) against gpufrac's GPU fakes,
outside any cluster: it loads the fake libnvidia-ml.so.1 from the fake driver root, discovers the four fake H200s,
serves the kubelet's DevicePlugin API on its socket (registration with a kubelet skipped: `--kubelet-socket=`),
answers Allocate under each device list strategy, and takes a GPU out when the fake NVML raises a critical XID.

The plugin's socket directory (/var/lib/kubelet/device-plugins) and CDI directory (/var/run/cdi) are compiled into
it: it runs in a mount namespace of its own with a tmpfs on /var/lib and /run, and the test reaches them through
/proc/<pid>/root. Needs root (unshare, mknod)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from e2e.toolkit.tools import find_binary
from testkit.device_plugin import generate_stubs
from testkit.fakes import driver_root
from testkit.fakes.state import FakeGpuState

pytestmark = pytest.mark.e2e

UUIDS = tuple(f"GPU-d9d0{i}{i}{i}{i}-1111-2222-3333-44444444444{i}" for i in range(4))
CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"
# A tmpfs on the plugin's compiled-in directories, in its own mount namespace; then the plugin itself. The marker
# says the tmpfs is there: until then /proc/<pid>/root/var/lib is the host's, where a real node's plugin (a session
# fixture of tests/node) may be serving the same socket name.
PRIVATE_MARKER = "var/lib/gpufrac-test-private"
PRIVATE_DIRS = ('mount -t tmpfs tmpfs /var/lib && mkdir -p /var/lib/kubelet/device-plugins'
                f' && mount -t tmpfs tmpfs /run && mkdir -p /run/cdi && touch /{PRIVATE_MARKER} && exec "$@"')


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="module")
def binaries() -> dict[str, str]:
    found = {name: find_binary(name) for name in ("nvidia-device-plugin", "nvidia-cdi-hook")}
    missing = [name for name, path in found.items() if path is None]
    reason = ""
    if missing:
        reason = f"NVIDIA's components are not built ({', '.join(missing)}): `make tools` (e2e/build-nvidia.sh)"
    elif os.geteuid() != 0:
        reason = "the plugin's private mount namespace and the fake device nodes need root"
    if reason and _in_ci():
        pytest.fail(f"CI is set: {reason}", pytrace=False)
    if reason:
        pytest.skip(reason)
    return {name: path for name, path in found.items() if path}


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, ModuleType]:
    return generate_stubs(tmp_path_factory.mktemp("deviceplugin-stubs"))


class Plugin:
    """The plugin running against four fake H200s; `stub` talks to its socket."""

    def __init__(self, tmp: Path, binaries: dict[str, str], stubs: tuple[ModuleType, ModuleType], strategy: str,
                 extra_env: dict[str, str]) -> None:
        self.pb, rpc = stubs
        self.state = FakeGpuState(tmp / "nvml.json")
        for uuid in UUIDS:
            self.state.gpu(uuid)
        self.driver = driver_root.build(tmp / "driver", self.state.path)
        self.trace = tmp / "nvml-calls"
        self.log_file = tmp / "plugin.log"
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", PRIVATE_DIRS, "sh",
                binaries["nvidia-device-plugin"], f"--driver-root={self.driver.path}",
                f"--driver-root-ctr-path={self.driver.path}", f"--dev-root={self.driver.path}", "--kubelet-socket=",
                f"--device-list-strategy={strategy}", "--device-id-strategy=uuid", "--fail-on-init-error=true",
                f"--nvidia-cdi-hook-path={binaries['nvidia-cdi-hook']}"]
        # LD_LIBRARY_PATH: the plugin decides it is on an NVML node by dlopen("libnvidia-ml.so.1") by name, as a
        # driver install (or NVIDIA's runtime in its container) makes possible; it then loads the root's by path.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_LIBRARY_PATH": str(self.driver.lib_dir),
               "GPUFRAC_FAKE_NVML": str(self.state.path), "GPUFRAC_FAKE_NVML_TRACE": str(self.trace), **extra_env}
        with open(self.log_file, "w") as log:
            self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.root = Path(f"/proc/{self.process.pid}/root")
        socket = self.root / "var/lib/kubelet/device-plugins/nvidia-gpu.sock"
        deadline = time.monotonic() + 30
        while not ((self.root / PRIVATE_MARKER).exists() and socket.exists()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the device plugin did not serve its socket:\n{self.log()[-3000:]}", pytrace=False)
            time.sleep(0.05)
        self.channel = grpc.insecure_channel(f"unix:{socket}")
        self.stub = rpc.DevicePluginStub(self.channel)

    def calls(self) -> set[str]:
        """The NVML functions the plugin has called so far."""
        return set(self.trace.read_text().split()) if self.trace.exists() else set()

    def wait_for_health_check(self) -> None:
        """Until the health check waits on its event set: every GPU registered, later XIDs reach it."""
        deadline = time.monotonic() + 30
        while "nvmlEventSetWait_v2" not in self.calls():
            assert time.monotonic() < deadline, f"no health check started:\n{self.log()[-3000:]}"
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def allocate(self, *uuids: str) -> Any:
        request = self.pb.AllocateRequest(container_requests=[self.pb.ContainerAllocateRequest(devices_ids=uuids)])
        [response] = self.stub.Allocate(request, timeout=10).container_responses
        return response

    def stop(self) -> None:
        if hasattr(self, "channel"):
            self.channel.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def start_plugin(tmp_path: Path, binaries: dict[str, str],
                 stubs: tuple[ModuleType, ModuleType]) -> Iterator[Any]:
    started: list[Plugin] = []

    def start(strategy: str = "envvar", **env: str) -> Plugin:
        started.append(Plugin(tmp_path, binaries, stubs, strategy, env))
        return started[-1]

    yield start
    for plugin in started:
        plugin.stop()


def health(response: Any) -> dict[str, str]:
    return {device.ID: device.health for device in response.devices}


def test_it_finds_the_fake_gpus_and_allocates_by_uuid_in_the_env(start_plugin: Any) -> None:
    plugin = start_plugin("envvar")
    first = next(plugin.stub.ListAndWatch(plugin.pb.Empty(), timeout=30))
    assert health(first) == dict.fromkeys(UUIDS, "Healthy")
    assert dict(plugin.allocate(UUIDS[1]).envs) == {"NVIDIA_VISIBLE_DEVICES": UUIDS[1]}
    assert dict(plugin.allocate(UUIDS[0], UUIDS[3]).envs) == {"NVIDIA_VISIBLE_DEVICES": f"{UUIDS[0]},{UUIDS[3]}"}
    plugin.wait_for_health_check()
    calls = plugin.calls()
    assert {"nvmlDeviceGetHandleByUUID", "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetMemoryInfo",
            "nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2"} <= calls


def test_under_cdi_cri_it_answers_cdi_names_from_a_spec_it_wrote_against_the_fakes(start_plugin: Any) -> None:
    plugin = start_plugin("cdi-cri")
    response = plugin.allocate(UUIDS[2])
    assert [d.name for d in response.cdi_devices] == [f"{CDI_KIND}={UUIDS[2]}"]
    assert "NVIDIA_VISIBLE_DEVICES" not in response.envs
    spec = json.loads((plugin.root / "run/cdi" / "k8s.device-plugin.nvidia.com-gpu.json").read_text())
    assert spec["kind"] == CDI_KIND
    devices = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    assert set(devices) >= set(UUIDS)
    assert [(n["path"], n["hostPath"]) for n in devices[UUIDS[2]]] == [
        ("/dev/nvidia2", str(plugin.driver.gpu_device(2)))]
    mounts = {m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    assert str(plugin.driver.library("libcuda")) in mounts


def test_under_cdi_annotations_it_answers_the_cdi_names_in_an_annotation(start_plugin: Any) -> None:
    plugin = start_plugin("cdi-annotations")
    annotations = dict(plugin.allocate(UUIDS[0]).annotations)
    assert list(annotations.values()) == [f"{CDI_KIND}={UUIDS[0]}"]
    assert all(key.startswith("cdi.k8s.io/") for key in annotations)


def test_a_critical_xid_on_a_fake_gpu_makes_it_unhealthy(start_plugin: Any) -> None:
    plugin = start_plugin("envvar")
    stream = plugin.stub.ListAndWatch(plugin.pb.Empty(), timeout=30)
    assert health(next(stream)) == dict.fromkeys(UUIDS, "Healthy")
    plugin.wait_for_health_check()
    plugin.state.xid_error(UUIDS[3], 13)  # an XID the plugin ignores (an application's error)
    plugin.state.xid_error(UUIDS[3], 79)  # "GPU has fallen off the bus"
    assert health(next(stream)) == {**dict.fromkeys(UUIDS[:3], "Healthy"), UUIDS[3]: "Unhealthy"}
    log = plugin.log()
    assert "Xid=79" in log and "Xid=13" not in log


def test_with_its_documented_switch_the_plugin_makes_no_health_check(start_plugin: Any) -> None:
    plugin = start_plugin("envvar", DP_DISABLE_HEALTHCHECKS="all")
    stream = plugin.stub.ListAndWatch(plugin.pb.Empty(), timeout=30)
    assert health(next(stream)) == dict.fromkeys(UUIDS, "Healthy")
    time.sleep(1)  # time enough for a health check to have started (it starts at once when on)
    calls = plugin.calls()
    assert "nvmlDeviceGetMinorNumber" in calls  # it did discover the GPUs
    assert not {"nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2"} & calls
