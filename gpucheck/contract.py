"""gpufrac's contract, restated: modes, paths, env names, value formats, the daemons' layout, argv and TOML, and
the r615/CUDA 13.4 rule. The check runs on a bare GPU node and imports nothing of gpufrac; tests/gpucheck asserts that
every value here equals gpufrac's own."""

from __future__ import annotations

import os
from dataclasses import dataclass

MIB = 1024 * 1024


TIME_SLICING, SM_SHARING = "time-slicing", "sm-sharing"
MODES = (TIME_SLICING, SM_SHARING)  # gpufrac.core.annotations.ComputeMode
GPUFRAC_MPS_ROOT = "/run/gpufrac/mps"  # contract.DEFAULT_MPS_ROOT: pipe directories <root>/<mode> (mps_pipe_dir)
GPUFRAC_MPS_LOG_ROOT = "/var/log/gpufrac/mps"  # AgentConfig.mps_log_root: <log root>/<mode>
GPUFRAC_MPS_CONFIG_DIR = "/run/gpufrac/mps-config"  # AgentConfig.mps_config_dir: <dir>/<mode>.toml
ENV_PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"  # contract.LimitEnv
ENV_LOG_DIRECTORY = "CUDA_MPS_LOG_DIRECTORY"
ENV_PINNED_MEM_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_MEMORY_REQUEST = "NVIDIA_GPU_MEMORY_REQUEST"
ENV_MEMORY_LIMIT = "NVIDIA_GPU_MEMORY_LIMIT"
ENV_ACTIVE_THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
CANONICAL_PREFIX = "gpufrac.io/container."  # gpufrac.core.annotations: the webhook's annotations per container
NVIDIA_PREFIX = "nvidia.com/container."  # the scheduler's (KAI's): <prefix><container>.gpus.devices
DEVICE_PLUGIN_CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"  # NVIDIA's device plugin's CDI kind; its devices: UUIDs
FRACTION_CONTAINER = "app"  # the runtime checks' fractional container
# CUDA 13.4 memory limits need driver r615+ and a CUDA driver API of 13.4 (13040) or later (agent.capabilities).
MIN_DRIVER_MAJOR = 615
MIN_CUDA_DRIVER_VERSION = 13040


def format_pinned_mem_limit(limit_mib: int, num_devices: int) -> str:
    """CUDA_MPS_PINNED_DEVICE_MEM_LIMIT as the webhook writes it (contract.format_pinned_mem_limit):
    `0=<limit>M,1=<limit>M,...`."""
    return ",".join(f"{index}={limit_mib}M" for index in range(num_devices))


def memory_env_value(mib: int) -> str:
    """NVIDIA_GPU_MEMORY_REQUEST / _LIMIT as the webhook writes them: an integer number of MiB."""
    return str(mib)


def fraction_annotations(container: str, mode: str, request_mib: int, limit_mib: int, devices: str) -> dict[str, str]:
    """A bound fraction's pod annotations: gpufrac's canonical ones as the webhook writes them (one GPU), and the
    GPU the scheduler bound (contract.write_canonical)."""
    ours = f"{CANONICAL_PREFIX}{container}."
    annotations = {f"{ours}compute-mode": mode, f"{ours}gpu-memory.request-mib": str(request_mib),
                   f"{ours}gpu-memory.limit-mib": str(limit_mib)}
    if mode == SM_SHARING:
        annotations[f"{ours}mps-pinned-mem-limit"] = format_pinned_mem_limit(limit_mib, 1)
    annotations[f"{NVIDIA_PREFIX}{container}.gpus.devices"] = devices
    return annotations


def fraction_env(request_mib: int, limit_mib: int, pipe_dir: str, devices: str) -> dict[str, str]:
    """An sm-sharing fraction's env as the kubelet resolves what the webhook injected (mutation.injected_env)."""
    return {"NVIDIA_VISIBLE_DEVICES": devices, ENV_MEMORY_REQUEST: memory_env_value(request_mib),
            ENV_MEMORY_LIMIT: memory_env_value(limit_mib), ENV_PINNED_MEM_LIMIT: format_pinned_mem_limit(limit_mib, 1),
            ENV_PIPE_DIRECTORY: pipe_dir}


def claim_env(gpu_uuid: str, pipe_dir: str, request_mib: int, limit_mib: int, compute_percent: int) -> dict[str, str]:
    """An sm-sharing DRA claim's container env, as the agent's Prepare writes it into the claim's CDI spec
    (dra_prepare.cdi_spec, for a GPU the toolkit's CDI spec names): the request and limit in MiB, the pipe directory,
    the pinned limit keyed by the GPU's UUID (which a narrowed CUDA_VISIBLE_DEVICES cannot void), the thread
    percentage (the claim's consumed `compute`)."""
    return {ENV_MEMORY_REQUEST: memory_env_value(request_mib), ENV_MEMORY_LIMIT: memory_env_value(limit_mib),
            ENV_PIPE_DIRECTORY: pipe_dir, ENV_PINNED_MEM_LIMIT: f"{gpu_uuid}={limit_mib}M",
            ENV_ACTIVE_THREAD_PERCENTAGE: str(compute_percent)}


def daemon_limit_commands(gpu_uuid: str, pinned_mib: int, thread_percent: int | None,
                          server_pids: list[int]) -> list[str]:
    """What the agent tells the sm-sharing daemon for a GPU whose fractions' largest limit is `pinned_mib`
    (decide.mps_limits.DaemonPlan): the defaults for servers to come, then each running server's (by PID)."""
    commands = [f"set_default_device_pinned_mem_limit {gpu_uuid} {pinned_mib}M"]
    if thread_percent is not None:
        commands.append(f"set_default_active_thread_percentage {thread_percent}")
    for pid in server_pids:
        commands.append(f"set_device_pinned_mem_limit {pid} {gpu_uuid} {pinned_mib}M")
        if thread_percent is not None:
            commands.append(f"set_active_thread_percentage {pid} {thread_percent}")
    return commands


NAMESPACE_SERVER = "gpufrac"  # the sm-sharing daemon's named server (decide.mps_namespaces.SERVER)


def namespace_commands(name: str, pinned_mib: int, thread_percent: int) -> list[list[str]]:
    """The MPS v3 words the agent gives `nvidia-cuda-mps-control` to make a container's namespace
    (decide.mps_namespaces.Namespace.create and set_limits)."""
    server = f"--server={NAMESPACE_SERVER}"
    return [["namespace", "create", name, server],
            ["namespace", "set", name, server, f"--pinned-memory-limit={pinned_mib}M",
             f"--active-thread-percentage={thread_percent}"]]


def namespace_delete(name: str) -> list[str]:
    return ["namespace", "delete", name, f"--server={NAMESPACE_SERVER}"]


def driver_major(version: str) -> int | None:
    digits = ""
    for char in version.strip():
        if not char.isdigit():
            break
        digits += char
    return int(digits) if digits else None


def has_driver_memory_limits(driver_version: str, cuda_driver_version: int) -> bool:
    major = driver_major(driver_version)
    return major is not None and major >= MIN_DRIVER_MAJOR and cuda_driver_version >= MIN_CUDA_DRIVER_VERSION


def modes_to_serve(driver_limits: bool) -> tuple[str, ...]:
    """The modes that get a daemon: without driver limits only sm-sharing (a legacy MPS server shares one context
    between its clients, which would silently turn time-slicing into sm-sharing)."""
    return MODES if driver_limits else (SM_SHARING,)


def render_config(mode: str, audit_log: bool = True) -> str:
    """The MPS v3 TOML the agent writes for one mode's daemon."""
    lines = [
        "# written by the gpufrac agent; rewritten at every daemon start",
        "[features.memacct]",
        "enabled = true",
        f"audit_log = {'true' if audit_log else 'false'}",
        "",
        "[features.context-share]",
        f"enabled = {'true' if mode == SM_SHARING else 'false'}",
    ]
    if mode == SM_SHARING:
        lines += ["", f"[servers.{NAMESPACE_SERVER}]"]  # the named server of each container's namespace
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class DaemonLayout:
    mode: str
    pipe_dir: str
    log_dir: str
    config_path: str

    @property
    def control_socket(self) -> str:
        return os.path.join(self.pipe_dir, "control")


def daemon_layout(root: str, mode: str) -> DaemonLayout:
    """The agent's layout (mps root, log root, config dir) rooted in this run's scratch directory."""
    return DaemonLayout(
        mode,
        os.path.join(root, "mps", mode),
        os.path.join(root, "log", mode),
        os.path.join(root, "config", f"{mode}.toml"),
    )


def daemon_argv(binary: str, mode: str, mps_v3: bool, config_path: str) -> tuple[str, ...]:
    """`-p 3 [-m] -f -a <config>` on r615+ (MPS v3, `-m`: multi-user for sm-sharing); `-f` on older drivers."""
    if not mps_v3:
        return (binary, "-f")
    argv = [binary, "-p", "3"]
    if mode == SM_SHARING:
        argv.append("-m")
    return (*argv, "-f", "-a", config_path)


def daemon_env(base_env: dict[str, str], layout: DaemonLayout) -> dict[str, str]:
    env = dict(base_env)
    env[ENV_PIPE_DIRECTORY] = layout.pipe_dir
    env[ENV_LOG_DIRECTORY] = layout.log_dir
    return env
