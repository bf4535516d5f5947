"""How this webhook is configured: who the scheduler is, where the MPS pipes live, what placement it requires."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import DEFAULT_MPS_ROOT, DEFAULT_SCHEDULER_USER, mps_pipe_dirs


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
    # Add a required node affinity on `gpufrac.io/enforcement.<mode>` so fractions only land where enforced.
    require_enforcing_node: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "mps_dirs", mps_pipe_dirs(self.mps_root))  # derived once: read per container

    def is_scheduler(self, user: UserInfo) -> bool:
        return user.username in self.scheduler_users or any(g in self.scheduler_groups for g in user.groups)
