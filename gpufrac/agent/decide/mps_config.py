"""How each MPS control daemon is started: arguments, environment, MPS v3 TOML config, memory budget. Pure.

One daemon per compute mode, each with its own pipe directory (`<mps root>/<mode>`, what the webhook mounts
into the mode's containers) and log directory (`<log root>/<mode>`).

- r615+ / CUDA 13.4 (MPS v3): `-p 3 -f -a <config>`; `[features.memacct]` accounts (and with the toolkit hook,
  enforces) memory per client. time-slicing: `context-share` disabled, so each client keeps its own context
  and is time-sliced. sm-sharing: `context-share` enabled and multi-user `-m`, so clients of any UID share
  the SMs.
- Older drivers (legacy MPS): `-f` and sm-sharing only (see capabilities.modes_to_serve); memory is capped by
  the client's `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, which the webhook injects.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufrac.agent.decide.capabilities import has_driver_memory_limits
from gpufrac.agent.decide.model import Inventory
from gpufrac.agent.decide.mps_namespaces import SERVER as NAMESPACE_SERVER
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import DEFAULT_MPS_ROOT, MIB, MPS_CONTROL_SOCKET, LimitEnv, mps_pipe_dir

LOG_DIRECTORY_ENV = "CUDA_MPS_LOG_DIRECTORY"  # where a daemon writes control.log (and MPS v3 its audit log)

# Memory the agent container needs: the agent itself and the control daemons, plus one MPS server context per
# GPU per daemon. KAI measured ~50 MiB per GPU server context and OOM'd at 256 MiB on nodes with > 5 GPUs; we
# size per GPU with headroom instead of one fixed number.
MULTI_USER_V3 = frozenset({ComputeMode.SM_SHARING})  # the modes whose MPS v3 daemon runs multi-user (`-m`)


def multi_user_modes(inventory: Inventory | None) -> frozenset[ComputeMode]:
    """Whose daemon serves every UID at once on this node: sm-sharing's on MPS v3 (r615+); a legacy daemon, and the
    time-slicing one, serve one user at a time."""
    return MULTI_USER_V3 if inventory is not None and has_driver_memory_limits(inventory) else frozenset()


AGENT_BASE_MIB = 128
SERVER_CONTEXT_MIB_PER_GPU = 64


@dataclass(frozen=True)
class DaemonSettings:
    """How the MPS control daemons run, whoever runs them: the defaults `gpufrac agent` and `gpufrac mps` share
    (programs/daemon_options.py)."""

    binary: str = "nvidia-cuda-mps-control"
    mps_root: Path = Path(DEFAULT_MPS_ROOT)
    log_root: Path = Path("/var/log/gpufrac/mps")
    config_dir: Path = Path("/run/gpufrac/mps-config")
    proc_root: Path = Path("/proc")  # the host's, to find the daemons and their servers
    quit_timeout: float = 60.0  # seconds a daemon gets to exit after `quit` before it is killed


@dataclass(frozen=True)
class MpsDaemonSpec:
    mode: ComputeMode
    argv: tuple[str, ...]
    env: dict[str, str]
    pipe_dir: Path
    log_dir: Path
    config_path: Path | None
    config_text: str | None

    @property
    def control_socket(self) -> Path:
        return self.pipe_dir / MPS_CONTROL_SOCKET


def render_config(mode: ComputeMode, *, audit_log: bool = True) -> str:
    """MPS v3 TOML for one mode's daemon (applied once, at daemon start).

    memacct with its audit log (written under CUDA_MPS_LOG_DIRECTORY) for both modes. context-share only for
    sm-sharing, where this daemon's own socket is the shared one; KAI runs a single daemon instead and so needs
    `default_socket = "off"` plus a `[servers.shared]` server for sm-sharing. sm-sharing's daemon also declares the
    named server whose namespaces hold each container's limits (mps_namespaces; every GPU, multi-user daemon).
    """
    lines = [
        "# written by the gpufrac agent; rewritten at every daemon start",
        "[features.memacct]",
        "enabled = true",
        f"audit_log = {'true' if audit_log else 'false'}",
        "",
        "[features.context-share]",
        f"enabled = {'true' if mode is ComputeMode.SM_SHARING else 'false'}",
    ]
    if mode is ComputeMode.SM_SHARING:
        lines += ["", f"[servers.{NAMESPACE_SERVER}]"]
    return "\n".join(lines) + "\n"


def daemon_spec(
    mode: ComputeMode,
    *,
    mps_v3: bool,
    binary: str,
    mps_root: Path,
    log_root: Path,
    config_dir: Path,
    base_env: dict[str, str] | None = None,
) -> MpsDaemonSpec:
    pipe_dir = Path(mps_pipe_dir(str(mps_root), mode))
    log_dir = log_root / str(mode)
    env = dict(base_env or {})
    env[LimitEnv.PIPE_DIRECTORY] = str(pipe_dir)
    env[LOG_DIRECTORY_ENV] = str(log_dir)
    if not mps_v3:
        return MpsDaemonSpec(mode, (binary, "-f"), env, pipe_dir, log_dir, None, None)
    config_path = config_dir / f"{mode}.toml"
    argv = [binary, "-p", "3"]
    if mode in MULTI_USER_V3:
        argv.append("-m")
    argv += ["-f", "-a", str(config_path)]
    return MpsDaemonSpec(
        mode,
        tuple(argv),
        env,
        pipe_dir,
        log_dir,
        config_path,
        render_config(mode),
    )


def memory_budget_bytes(gpu_count: int, daemons: int) -> int:
    """What the agent container's memory limit must be at least, for this many GPUs and daemons."""
    return (AGENT_BASE_MIB + SERVER_CONTEXT_MIB_PER_GPU * gpu_count * daemons) * MIB


def memory_problem(limit_bytes: int | None, gpu_count: int, daemons: int) -> str | None:
    """A message for the node condition when the container's memory limit is below the budget, else None."""
    need = memory_budget_bytes(gpu_count, daemons)
    if limit_bytes is None or daemons == 0 or limit_bytes >= need:
        return None
    return (
        f"the agent's memory limit {limit_bytes // MIB}Mi is below the {need // MIB}Mi that {daemons} MPS "
        f"daemon(s) need on {gpu_count} GPU(s) ({AGENT_BASE_MIB}Mi + {SERVER_CONTEXT_MIB_PER_GPU}Mi per GPU "
        "per daemon); MPS servers would fail with CUDA_ERROR_OUT_OF_MEMORY; raise "
        "agent.resources.limits.memory"
    )
