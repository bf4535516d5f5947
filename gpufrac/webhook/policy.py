"""How this webhook is configured: who the scheduler is, where the MPS pipes live, what placement it requires."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpufrac.core.annotations import DEFAULT_MPS_ROOT, ComputeMode

DEFAULT_SCHEDULER_USERS = ("system:serviceaccount:kai-scheduler:binder",)


def _default_mps_dirs() -> Mapping[ComputeMode, str]:
    return MappingProxyType({mode: f"{DEFAULT_MPS_ROOT}/{mode}" for mode in ComputeMode})


@dataclass(frozen=True)
class UserInfo:
    username: str
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class Policy:
    scheduler_users: frozenset[str] = frozenset(DEFAULT_SCHEDULER_USERS)
    scheduler_groups: frozenset[str] = frozenset()
    # Host directory of each mode's MPS pipes; mounted at the same path in the container.
    mps_dirs: Mapping[ComputeMode, str] = field(default_factory=_default_mps_dirs)
    # Add a required node affinity on `gpufrac.io/enforcement.<mode>` so fractions only land where enforced.
    require_enforcing_node: bool = False

    def is_scheduler(self, user: UserInfo) -> bool:
        return user.username in self.scheduler_users or any(g in self.scheduler_groups for g in user.groups)
