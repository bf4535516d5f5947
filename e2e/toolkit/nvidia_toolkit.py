"""NVIDIA's container toolkit on the real node, set up with its own commands the way NVIDIA documents it
(binaries built by e2e/build-nvidia.sh into the tools cache):

- the node's CDI spec: `nvidia-ctk cdi generate` against the fake NVML and the fake driver root (kind
  `nvidia.com/gpu`, devices by index and UUID and `all`, with the control devices, driver library mounts and
  hooks it finds), written into containerd's `cdi_spec_dirs`;
- the toolkit's config.toml (`nvidia-ctk config default`, then `nvidia-ctk config --set ... --in-place`), found by
  nvidia-container-runtime through NVIDIA_CTK_CONFIG_FILE_PATH (containerd's env, which its shims and runtimes
  inherit); `set_hardened` flips `accept-nvidia-visible-devices-envvar-when-unprivileged` in place (the runtime
  reads the file on every container it creates: no restart);
- containerd: `nvidia-ctk runtime configure --runtime=containerd --config=<node's config> --cdi.enabled` adds the
  `nvidia` runtime handler (runc's options, BinaryName nvidia-container-runtime) in a drop-in file the top-level
  config imports; runc stays the default handler (GPU Operator 25.10+ no longer makes `nvidia` the default), so a
  pod asks for NVIDIA's runtime with `runtimeClassName: nvidia`.

The fakes meet NVIDIA's code where a real node's driver would: libnvidia-ml.so.1 under the driver root
(go-nvml dlopens it), the fake's state file named by GPUFRAC_FAKE_NVML, /dev/nvidia* from e2e.toolkit.gpu_devices.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from e2e.toolkit.errors import ClusterError, ToolsMissingError
from e2e.toolkit.tools import find_binary, tools_cache

TOOLKIT_BINARIES = ("nvidia-ctk", "nvidia-cdi-hook", "nvidia-container-runtime")
RUNTIME_HANDLER = "nvidia"  # the name `nvidia-ctk runtime configure` and NVIDIA's RuntimeClass give it
SPEC_FILE = "nvidia.yaml"  # the name NVIDIA's docs give the generated spec (/etc/cdi/nvidia.yaml)
HARDENED_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"
CONFIG_ENV = "NVIDIA_CTK_CONFIG_FILE_PATH"


def nvidia_binaries(names: Sequence[str] = TOOLKIT_BINARIES) -> dict[str, str]:
    """The NVIDIA components' paths in the tools cache; ToolsMissingError names what is missing."""
    found = {name: find_binary(name) for name in names}
    missing = [n for n, p in found.items() if p is None]
    if missing:
        raise ToolsMissingError(f"missing NVIDIA components: {', '.join(missing)} (looked in "
                                f"{tools_cache() / 'bin'}); build them with `bash e2e/build-nvidia.sh`")
    return {n: p for n, p in found.items() if p}


class NvidiaToolkit:
    def __init__(self, root: Path, driver_root: Path, nvml_env: Mapping[str, str], *,
                 dev_root: Path = Path("/")) -> None:
        """`root`: the toolkit's own directory on the node (its config.toml, logs); `driver_root`: where the
        driver's files are (the fake driver root); `nvml_env`: what the fake NVML needs in every NVIDIA process
        (its state file); `dev_root`: the root whose dev/ holds the GPUs' device nodes."""
        self.root = root
        self.driver_root = driver_root
        self.dev_root = dev_root
        self.nvml_env = dict(nvml_env)
        self.bins = nvidia_binaries()

    @property
    def config_file(self) -> Path:
        return self.root / "config.toml"

    def env(self) -> dict[str, str]:
        """For NVIDIA's processes (and containerd, whose shims start nvidia-container-runtime): the fake NVML's
        env, the toolkit's config file, the tools cache first on PATH (nvidia-cdi-hook, runc)."""
        path = os.pathsep.join([str(Path(self.bins["nvidia-ctk"]).parent), os.environ.get("PATH", "/usr/bin")])
        return {**os.environ, **self.nvml_env, CONFIG_ENV: str(self.config_file), "PATH": path}

    def ctk(self, *args: str, timeout: float = 120) -> str:
        res = subprocess.run([self.bins["nvidia-ctk"], *args], capture_output=True, text=True, timeout=timeout,
                             env=self.env())
        if res.returncode != 0:
            raise ClusterError(f"nvidia-ctk {' '.join(args)} failed (rc {res.returncode}):\n"
                               f"{(res.stderr or res.stdout).strip()[-3000:]}")
        return res.stdout + res.stderr

    # ---- the CDI spec ------------------------------------------------------------------------------------------

    def generate_cdi_spec(self, out: Path, *args: str) -> Path:
        """`nvidia-ctk cdi generate` into `out` (by default kind nvidia.com/gpu, devices by index and by UUID, and
        `all`); `args`: more of its flags."""
        out.parent.mkdir(parents=True, exist_ok=True)
        self.ctk("cdi", "generate", f"--output={out}", f"--driver-root={self.driver_root}",
                 f"--dev-root={self.dev_root}", f"--nvidia-cdi-hook-path={self.bins['nvidia-cdi-hook']}", *args)
        return out

    # ---- the toolkit's config.toml -----------------------------------------------------------------------------

    def write_config(self, cdi_dirs: Sequence[Path], runc: str, *, hardened: bool = False,
                     disabled_hooks: Sequence[str] = ()) -> Path:
        """NVIDIA's default config with the node's paths: the CDI spec directories, the runc it wraps, the driver
        root (also where its jit-cdi mode finds device nodes), its logs; `hardened`: the envvar is not accepted
        from unprivileged containers; `disabled_hooks`: hooks its jit-cdi mode leaves out."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.ctk("config", "default", f"--output={self.config_file}")
        self.ctk("config", f"--config-file={self.config_file}", "--in-place", "--set-list-separator=|",
                 "--set", f"nvidia-container-runtime.modes.cdi.spec-dirs={'|'.join(map(str, cdi_dirs))}",
                 "--set", f"nvidia-container-runtime.runtimes={runc}",
                 "--set", f"nvidia-container-runtime.debug={self.root / 'nvidia-container-runtime.log'}",
                 "--set", f"nvidia-container-cli.root={self.driver_root}",
                 "--set", f"nvidia-ctk.path={self.bins['nvidia-cdi-hook']}")
        if disabled_hooks:
            self.ctk("config", f"--config-file={self.config_file}", "--in-place", "--set-list-separator=|",
                     "--set", f"nvidia-container-runtime.modes.jit-cdi.nvcdi-disable-hooks={'|'.join(disabled_hooks)}")
        self.set_hardened(hardened)
        return self.config_file

    def set_hardened(self, hardened: bool) -> None:
        self.ctk("config", f"--config-file={self.config_file}", "--in-place",
                 "--set", f"{HARDENED_KEY}={str(not hardened).lower()}")

    def hardened(self) -> bool:
        for line in self.config_file.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == HARDENED_KEY:
                return value.strip() == "false"
        return False

    # ---- containerd ----------------------------------------------------------------------------------------------

    def configure_containerd(self, containerd_config: Path) -> Path:
        """`nvidia-ctk runtime configure` on the node's containerd config; returns the drop-in it wrote."""
        drop_in = containerd_config.parent / "conf.d" / "99-nvidia.toml"
        self.ctk("runtime", "configure", "--runtime=containerd", f"--config={containerd_config}",
                 f"--drop-in-config={drop_in}", "--config-source=file",
                 f"--nvidia-runtime-name={RUNTIME_HANDLER}",
                 f"--nvidia-runtime-path={self.bins['nvidia-container-runtime']}", "--cdi.enabled")
        if not drop_in.is_file():
            raise ClusterError(f"nvidia-ctk runtime configure wrote no {drop_in}")
        return drop_in


MEMORY_LIMIT_HOOK = "apply-cuda-memory-limits"


def hooks_this_host_cannot_run(cgroup_root: Path = Path("/sys/fs/cgroup")) -> list[str]:
    """The hooks that would fail every container they are given here. Toolkit 1.20's spec gives each GPU the
    `apply-cuda-memory-limits` createRuntime hook, which fails (and with it the container) on a cgroup v1 host
    whenever the container has NVIDIA_GPU_MEMORY_REQUEST or _LIMIT in its env ("setting GPU memory limits is only
    supported in cgroup v2"): every gpufrac fraction has. NVIDIA's documented switches leave it out
    (`nvidia-ctk cdi generate --disable-hook`, jit-cdi's `nvcdi-disable-hooks`), as an operator of a cgroup v1
    node must."""
    return [] if (cgroup_root / "cgroup.controllers").exists() else [MEMORY_LIMIT_HOOK]


def runtime_class() -> dict[str, object]:
    """NVIDIA's RuntimeClass (as the GPU Operator creates it)."""
    return {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": RUNTIME_HANDLER},
            "handler": RUNTIME_HANDLER}
