"""The node's fake GPU device nodes and the CDI specs that name them, as NVIDIA's driver and toolkit lay them out.

Device nodes: /dev/nvidia0..N-1 (one per GPU of the fake NVML, in its index order), /dev/nvidiactl,
/dev/nvidia-uvm and /dev/nvidia-uvm-tools, made with mknod on the host's /dev, where containerd and runc look
them up, and removed on the way out. Their numbers are those of /dev/null (c 1:3): opening one is harmless
(reads end at once, writes vanish) and runc's default device rules already allow it. A driver's device is never
major 1, which is how `remove` tells ours from a real driver's, also after a crash that lost the node's state.

CDI specs: kind `nvidia.com/gpu` as `nvidia-ctk cdi generate` writes it (devices `0`.., `GPU-<uuid>`.. and `all`;
the control devices in the spec's own containerEdits), and kind `k8s.device-plugin.nvidia.com/gpu` as NVIDIA's
device plugin writes it (devices named by UUID).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from e2e.toolkit.errors import ClusterError

FAKE_DEVICE = os.makedev(1, 3)  # /dev/null's numbers
CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
CDI_VERSION = "0.5.0"
TOOLKIT_KIND = "nvidia.com/gpu"
DEVICE_PLUGIN_KIND = "k8s.device-plugin.nvidia.com/gpu"


def gpu_device(index: int, dev: Path = Path("/dev")) -> Path:
    return dev / f"nvidia{index}"


def device_paths(count: int, dev: Path = Path("/dev")) -> list[Path]:
    """The GPUs' device nodes, then the control devices."""
    return [*(gpu_device(i, dev) for i in range(count)), *(dev / name for name in CONTROL_DEVICES)]


def is_fake(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == FAKE_DEVICE


def create(count: int, dev: Path = Path("/dev")) -> list[str]:
    """Make the device nodes of `count` GPUs and the control devices; a path a driver made is a ClusterError
    (never shadow a real GPU)."""
    paths = device_paths(count, dev)
    real = [str(p) for p in paths if os.path.lexists(p) and not is_fake(p)]
    if real:
        raise ClusterError(f"{', '.join(real)} exist and are not the harness's fake devices (c 1:3): this machine "
                           "has an NVIDIA driver; the real node's fake GPUs would shadow it")
    for path in paths:
        if not os.path.lexists(path):
            os.mknod(path, 0o666 | stat.S_IFCHR, FAKE_DEVICE)
            os.chmod(path, 0o666)  # mknod honours the umask
    return [str(p) for p in paths]


def remove(dev: Path = Path("/dev")) -> list[str]:
    """Remove every fake NVIDIA device node under `dev` (and nothing a driver made); returns what went."""
    gone = []
    for path in sorted(dev.glob("nvidia*")):
        if is_fake(path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            gone.append(str(path))
    return gone


def _nodes(paths: Sequence[Path]) -> list[dict]:
    return [{"path": str(p), "hostPath": str(p)} for p in paths]


def toolkit_spec(uuids: Sequence[str], dev: Path = Path("/dev")) -> dict:
    """`nvidia-ctk cdi generate --device-name-strategy=index,uuid`'s shape (without its driver mounts and
    hooks: the fake driver has no libraries)."""
    devices = []
    for i, uuid in enumerate(uuids):
        edits = {"deviceNodes": _nodes([gpu_device(i, dev)])}
        devices += [{"name": str(i), "containerEdits": edits}, {"name": uuid, "containerEdits": edits}]
    devices.append({"name": "all", "containerEdits": {
        "deviceNodes": _nodes([gpu_device(i, dev) for i in range(len(uuids))])}})
    return {
        "cdiVersion": CDI_VERSION,
        "kind": TOOLKIT_KIND,
        "devices": devices,
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": _nodes([dev / name for name in CONTROL_DEVICES]),
        },
    }


def device_plugin_spec(uuids: Sequence[str], dev: Path = Path("/dev")) -> dict:
    """NVIDIA's device plugin's spec (cdi-annotations / cdi-cri strategy, deviceIDStrategy uuid)."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": DEVICE_PLUGIN_KIND,
        "devices": [{"name": uuid, "containerEdits": {"deviceNodes": _nodes([gpu_device(i, dev)])}}
                    for i, uuid in enumerate(uuids)],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": _nodes([dev / name for name in CONTROL_DEVICES]),
        },
    }


def spec_file_name(kind: str) -> str:
    """The file name NVIDIA's tools give a kind's spec: `vendor/class` with the slash as a dash."""
    return kind.replace("/", "-") + ".json"


def write_cdi_specs(cdi_dir: Path, uuids: Sequence[str], dev: Path = Path("/dev")) -> list[Path]:
    cdi_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in (toolkit_spec(uuids, dev), device_plugin_spec(uuids, dev)):
        path = cdi_dir / spec_file_name(spec["kind"])
        path.write_text(json.dumps(spec, indent=2) + "\n")
        written.append(path)
    return written
