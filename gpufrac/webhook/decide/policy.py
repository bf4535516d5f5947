"""How this webhook is configured: who the scheduler is, where the MPS pipes live, what placement it requires."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import (
    DEFAULT_DRIVER_NAME,
    DEFAULT_MPS_ROOT,
    DEFAULT_SCHEDULER_USER,
    Delivery,
    mps_pipe_dirs,
    mps_shm_dir,
)


@dataclass(frozen=True)
class UserInfo:
    username: str
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class Policy:
    scheduler_users: frozenset[str] = frozenset({DEFAULT_SCHEDULER_USER})
    scheduler_groups: frozenset[str] = frozenset()
    # Host directory holding each mode's MPS pipe directory (the agent's --mps-root); mounted at the same path.
    mps_root: str = DEFAULT_MPS_ROOT
    mps_dirs: Mapping[ComputeMode, str] = field(init=False, repr=False, compare=False)
    # The daemons' shared memory on the host, <mps_root>/shm (hostPath delivery; the CSI driver knows its own).
    mps_shm_dir: str = field(init=False, repr=False, compare=False)
    # How fractional containers get the MPS directories: a CSI inline volume served by the node agent (allowed by
    # Pod Security baseline), or hostPath volumes (needs a privileged namespace).
    delivery: Delivery = Delivery.CSI
    csi_driver: str = DEFAULT_DRIVER_NAME
    # Add a required node affinity on `gpufrac.io/enforcement.<mode>` so fractions only land where enforced.
    require_enforcing_node: bool = False
    # Let several containers of one pod each hold a fraction; KAI's binder binds one per pod.
    allow_multiple_fraction_containers: bool = False
    # Give a controller's fractional pods the node affinity the reclaim back-off label fails (agent: reclaim.policy
    # evict with reclaim.backoffSeconds > 0); otherwise no agent writes that label, and no affinity is added for it.
    keep_off_reclaimed_nodes: bool = False
    # The compute mode written on CREATE for a fraction that names none (default_mode); None: KAI's, time-slicing.
    default_mode: ComputeMode | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mps_dirs", mps_pipe_dirs(self.mps_root))  # derived once: read per container
        object.__setattr__(self, "mps_shm_dir", mps_shm_dir(self.mps_root))

    def is_scheduler(self, user: UserInfo) -> bool:
        return user.username in self.scheduler_users or any(g in self.scheduler_groups for g in user.groups)
