"""The GPU device nodes a container is given: each GPU's `/dev/nvidia<index>` and the control devices every CUDA
process opens (as NVIDIA's device plugin and toolkit give them). Pure; the node core's, read by the CDI spec reader
(edges.cdi_specs) and handed out by the NRI door."""

from __future__ import annotations

from dataclasses import dataclass

CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
GPU_DEVICE_PREFIX = "/dev/nvidia"


@dataclass(frozen=True)
class DeviceNode:
    """A host character device, as the runtime adds it to a container (and allows it in the device cgroup)."""

    path: str
    major: int
    minor: int
    file_mode: int = 0o666
