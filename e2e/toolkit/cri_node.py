"""containerd 2 alone (the tools cache's, as the real node runs it: its CRI with NRI and CDI on, runc), with fake GPU
device nodes in a directory of its own (<root>/dev, NVIDIA's numbers) and the CDI specs NVIDIA's tools generate for
them against the fake NVML and a fake driver root: `nvidia-ctk cdi generate` of kind `nvidia.com/gpu` (by index and
UUID) and of the device plugin's kind `k8s.device-plugin.nvidia.com/gpu` (by UUID, as its CDI strategies name
them). For a CRI client that makes pods itself (crictl, a bench). No kubelet (it removes pods it did not make), no
CNI (host-network pods only), no machine lock (nothing here is machine-wide: sockets, state, devices and specs live
under `root`)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from e2e.toolkit import gpu_devices
from e2e.toolkit.containerd import Containerd
from e2e.toolkit.netns import NodeNetwork
from e2e.toolkit.nvidia_device_plugin import CDI_KIND
from e2e.toolkit.nvidia_toolkit import NvidiaToolkit, hooks_this_host_cannot_run
from e2e.toolkit.wait import wait_until

IMAGE_ARCHIVES = ("pause.oci.tar", "app.oci.tar")


class CriNode:
    def __init__(self, root: Path, pause_image: str, uuids: Sequence[str], *,
                 nri_required_plugins: Sequence[str] = (), nri_tolerate_annotation: str = "") -> None:
        """`root`: keep it short, a unix socket's path must stay under 108 bytes. `nri_required_plugins`: NRI's
        default validator refuses containers while one of them is not connected (Containerd's)."""
        self.root = root
        self.dev = root / "dev"
        self.uuids = tuple(uuids)
        # the network only fills containerd's CNI config, which host-network pods never use
        self.containerd = Containerd(root / "containerd", pause_image, NodeNetwork(bridge="gpufraccri0"),
                                     nri_required_plugins=nri_required_plugins,
                                     nri_tolerate_annotation=nri_tolerate_annotation)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def cdi_dir(self) -> Path:
        return self.containerd.cdi_dir

    @property
    def socket(self) -> Path:
        return self.containerd.socket

    @property
    def nri_socket(self) -> Path:
        return self.containerd.nri_socket

    def start(self, images_dir: Path) -> None:
        from testkit.fakes import driver_root
        from testkit.fakes.state import FakeGpuState

        self.dev.mkdir(parents=True, exist_ok=True)
        gpu_devices.create(len(self.uuids), self.dev)
        state = FakeGpuState(self.root / "nvml.json")
        for uuid in self.uuids:
            state.gpu(uuid)
        driver_root.build(self.root / "driver", self.root / "nvml.json", device_nodes=False)
        toolkit = NvidiaToolkit(self.root / "nvidia-toolkit", self.root / "driver",
                                {"GPUFRAC_FAKE_NVML": str(self.root / "nvml.json")}, dev_root=self.root)
        self.containerd.write_config()
        skip = [f"--disable-hook={hook}" for hook in hooks_this_host_cannot_run()]
        toolkit.generate_cdi_spec(self.cdi_dir / "nvidia.yaml", *skip)
        vendor, cls = CDI_KIND.split("/")
        toolkit.generate_cdi_spec(self.cdi_dir / f"{vendor}-{cls}.yaml", "--device-name-strategy=uuid",
                                  f"--vendor={vendor}", f"--class={cls}", *skip)
        argv = [Containerd.binary("containerd"), "--config", str(self.containerd.config_file), "--log-level", "warn"]
        self.proc = subprocess.Popen(argv, env=self.containerd.env(), stdout=(self.root / "containerd.log").open("ab"),
                                     stderr=subprocess.STDOUT)
        wait_until(self.containerd.ready, 120, "containerd's CRI socket", interval=0.2)
        for archive in IMAGE_ARCHIVES:
            self.containerd.import_image(images_dir / archive)

    def containers(self) -> list[str]:
        return self.containerd.ctr("containers", "list", "-q").stdout.split()

    def stop(self, crictl: str | None = None) -> None:
        """Stops containerd; with `crictl`, first removes every pod left (their shims would outlive containerd)."""
        if self.proc is not None:
            if crictl:
                subprocess.run([crictl, "--runtime-endpoint", f"unix://{self.socket}", "rmp", "-f", "-a"],
                               capture_output=True, timeout=120, check=False)
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        gpu_devices.remove(self.dev)

