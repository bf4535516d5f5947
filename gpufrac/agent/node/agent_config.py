"""What `gpufrac agent` is told (its command line, programs/node_agent.py): one AgentConfig; every default once."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from gpufrac.agent.decide import capabilities
from gpufrac.agent.decide.hard_limits import WithoutHardLimit
from gpufrac.agent.decide.mps_config import DaemonSettings
from gpufrac.agent.edges.supervisor import RestartPolicy
from gpufrac.agent.node.guarantee import GuaranteeConfig
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import DEFAULT_DRIVER_NAME

_DAEMON = DaemonSettings()


class DaemonOwner(StrEnum):
    """Who runs the MPS control daemons."""

    AGENT = "agent"  # the agent, as its children: they stop with it (outside Kubernetes, tests)
    EXTERNAL = "external"  # `gpufrac mps` in the gpufrac-mps DaemonSet; the agent finds and watches them


@dataclass(frozen=True)
class AgentConfig:
    node: str
    modes: tuple[ComputeMode, ...] = tuple(ComputeMode)
    mps_binary: str = _DAEMON.binary
    mps_root: Path = _DAEMON.mps_root
    mps_log_root: Path = _DAEMON.log_root
    mps_config_dir: Path = _DAEMON.config_dir
    proc_root: Path = _DAEMON.proc_root
    memory_limit_file: Path = Path("/sys/fs/cgroup/memory.max")
    # cgroup v2: whether the dmem controller (the driver's soft and hard memory limits) is there (decide.soft_limits)
    cgroup_controllers_file: Path = Path("/sys/fs/cgroup/cgroup.controllers")
    interval: float = 10.0
    evict_on_violation: bool = False
    restart_policy: RestartPolicy = field(default_factory=RestartPolicy)
    quit_timeout: float = _DAEMON.quit_timeout
    watch_timeout: int = 300
    startup_wait: float = 10.0  # how long a first tick waits for new daemons before publishing labels
    # Published with the same status as gpufrac.io/Ready: KAI's NvFractions mode places fractions only where it is True
    extra_condition_types: tuple[str, ...] = capabilities.KAI_CONDITION_TYPES
    csi_driver: str = DEFAULT_DRIVER_NAME
    mps_daemons: DaemonOwner = DaemonOwner.AGENT
    guarantee: GuaranteeConfig = field(default_factory=GuaranteeConfig)  # container totals, reclaim above request
    # Where the driver cannot hold a fraction's limit on its cgroup: say so (report) or refuse its creation (refuse)
    without_hard_limit: WithoutHardLimit = WithoutHardLimit.REPORT
    image: str = ""  # the image the agent runs in (--image): part of the build compared with the MPS pods'
