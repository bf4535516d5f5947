"""NVIDIA's device plugin (k8s-device-plugin v0.18, built by e2e/build-nvidia.sh) as a process on the node,
configured as NVIDIA's Helm chart configures its DaemonSet, through its documented flags and env:

- `--device-list-strategy`: `envvar` (the standalone plugin's default: `NVIDIA_VISIBLE_DEVICES=<uuid>` in the
  Allocate answer), `cdi-cri` (CDI names `k8s.device-plugin.nvidia.com/gpu=<uuid>` in the answer's CDI devices)
  or `cdi-annotations`; with a CDI strategy it writes its own spec at start (`nvcdi` against the driver root);
- `--driver-root` / `--driver-root-ctr-path`: the fake driver root (the same path on the host and for the plugin,
  which runs on the host), `--dev-root=/`: the fake /dev/nvidia* nodes;
- health checks: the plugin registers NVML event sets for XID errors on every GPU (`nvmlEventSetCreate`,
  `nvmlDeviceRegisterEvents`, `nvmlEventSetWait_v2`); `disable_healthchecks=True` sets its documented switch
  `DP_DISABLE_HEALTHCHECKS=all` instead, for a fake NVML without event sets.

The plugin writes its CDI spec to /var/run/cdi, a path compiled into it. It runs in a mount namespace of its own
(`unshare --mount`, private propagation) where the node's CDI directory (containerd's `cdi_spec_dirs`) is bound
onto /run/cdi: the host's /run/cdi is only the mount point (made, and removed on cleanup, when absent). The
kubelet's socket is the machine-wide /var/lib/kubelet/device-plugins/kubelet.sock, where every device plugin
registers.

NVIDIA's own deployment, its Helm chart's DaemonSet in the namespace `nvidia-device-plugin` with its image
(IMAGE), is tests/node/resources/nvidia-device-plugin.yaml; a test runs it in place of the host process.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from e2e.toolkit.nvidia_toolkit import nvidia_binaries

RESOURCE = "nvidia.com/gpu"
IMAGE = "nvcr.io/nvidia/k8s-device-plugin:v0.18.0"  # NVIDIA's image name, made locally by e2e/build-image.sh
MPS_ROOT_PARENT = "/run/nvidia"  # NVIDIA's chart mounts its MPS root /run/nvidia/mps (DirectoryOrCreate)
CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"
STRATEGIES = ("envvar", "cdi-cri", "cdi-annotations")
HOST_CDI_DIR = Path("/run/cdi")  # = /var/run/cdi, the plugin's compiled-in spec directory
DRIVER_LIB_DIR = "usr/lib/x86_64-linux-gnu"  # where a driver root keeps libnvidia-ml.so.1


def spec_path(cdi_dir: Path) -> Path:
    """Where the plugin's spec lands (its name: the kind with the slash as a dash)."""
    return cdi_dir / (CDI_KIND.replace("/", "-") + ".json")


def argv(strategy: str, driver_root: Path, cdi_dir: Path) -> list[str]:
    """The plugin's command line, wrapped in its own mount namespace with `cdi_dir` on /run/cdi."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown device list strategy {strategy!r} (one of {', '.join(STRATEGIES)})")
    bins = nvidia_binaries(("nvidia-device-plugin", "nvidia-cdi-hook"))
    plugin = [bins["nvidia-device-plugin"], f"--device-list-strategy={strategy}", "--device-id-strategy=uuid",
              f"--driver-root={driver_root}", f"--driver-root-ctr-path={driver_root}", "--dev-root=/",
              f"--nvidia-cdi-hook-path={bins['nvidia-cdi-hook']}", "--fail-on-init-error=true"]
    bind = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", bind, "sh", str(cdi_dir),
            str(HOST_CDI_DIR), *plugin]


def env(nvml_env: Mapping[str, str], base: Mapping[str, str], driver_root: Path, *,
        disable_healthchecks: bool) -> dict[str, str]:
    """The plugin's env: the fake NVML's, and the driver root's library directory on LD_LIBRARY_PATH. The plugin
    checks for NVML with a plain dlopen("libnvidia-ml.so.1") before it uses the driver root's copy; in NVIDIA's
    DaemonSet the library is on the container's library path, put there by NVIDIA's runtime."""
    out = {**base, **nvml_env, "LD_LIBRARY_PATH": str(driver_root / DRIVER_LIB_DIR)}
    if disable_healthchecks:
        out["DP_DISABLE_HEALTHCHECKS"] = "all"
    return out
