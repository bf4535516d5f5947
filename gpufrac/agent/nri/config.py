"""The NRI plugin's settings (no wire imports: the CLI reads its defaults without the generated messages)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufrac.agent.decide.gpu_stack import DEFAULT_TRUSTED_NAMESPACES
from gpufrac.agent.edges.kubelet_checkpoint import DEFAULT_CHECKPOINT

DEFAULT_SOCKET = Path("/var/run/nri/nri.sock")
DEFAULT_LOCK_FILE = Path("/run/gpufrac/nri/plugin.lock")


@dataclass(frozen=True)
class NriConfig:
    socket_path: Path = DEFAULT_SOCKET
    name: str = "gpufrac"  # what containerd's required_plugins names
    index: str = "10"  # two digits: plugins are called in index order
    lock_file: Path | None = DEFAULT_LOCK_FILE
    retry_interval: float = 1.0  # between tries while the socket is absent or refuses us
    void_env_grants: bool = True  # containers that are no fraction get NVIDIA_VISIBLE_DEVICES=void
    # no NRI socket: the node is not Ready for fractions (False), unless the operator accepts GPUs handed out by the
    # env var alone, which any pod on the node can also set (nri.envFallback)
    env_fallback: bool = False
    trusted_namespaces: frozenset[str] = DEFAULT_TRUSTED_NAMESPACES  # keep env grants
    device_checkpoint: Path = DEFAULT_CHECKPOINT  # the kubelet's: which whole GPUs it allocated to which container
    proc_root: Path = Path("/proc")  # the host's (the agent runs with hostPID): a container created while away is
    # stopped by killing its first process, once its cgroup there names the container
