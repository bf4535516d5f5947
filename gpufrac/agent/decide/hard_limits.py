"""The hard limit: the driver's memory limit on each fractional container's own cgroup, and which boundary holds.

NVIDIA documents one limit a process cannot lift: `nvmlDeviceSetMemoryLimits_v1` on the container's cgroup (cgroup v2
`dmem.max`/`dmem.min`, driver r615+ with CUDA 13.4; the toolkit's `apply-cuda-memory-limits` hook makes that call at
creation when the CDI spec in use carries it). MPS limits (the daemon's, a namespace's, the env's) are cooperative: a
client whose env names a GPU it cannot see loses every pinned limit (NVIDIA's measurement on 615.71.09). So the agent
sets each fractional container's limit on its cgroup itself, through NVML, and reads it back; a mode's boundary is
`hard` on a node only where every placed fraction of it is held that way.

Pure: the cgroup directory a /proc/<pid>/cgroup names, the limits wanted, the boundary per mode.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpufrac.agent.decide.model import GpuInfo, RunningContainer
from gpufrac.agent.decide.mps_limits import gpu_uuid
from gpufrac.core.annotations import ComputeMode

MIB = 1 << 20
NO_LIMIT = (1 << 64) - 1  # NVML's hard limit when none is set
CGROUP_ROOT = "/sys/fs/cgroup"
BOUNDARY_LABEL_PREFIX = "gpufrac.io/boundary."  # + the mode: hard, cooperative or none


class WithoutHardLimit(StrEnum):
    """What a node does where the driver cannot hold a cgroup limit (cgroup v1, before r615, NVML refuses): the
    operator's choice (the chart's enforcement.withoutHardLimit)."""

    REPORT = "report"  # the boundary labels and the condition say so; fractions are still placed and created
    REFUSE = "refuse"  # creations of fractions are refused on that node, with the reason


class Boundary(StrEnum):
    HARD = "hard"  # the driver holds it on the container's cgroup, set and read back
    COOPERATIVE = "cooperative"  # MPS daemon-side or env limits, which a process can lift by documented tricks
    NONE = "none"  # nothing holds it but the audit's reaction


def cgroup_dir(text: str) -> str | None:
    """The directory of a process's cgroup, from its /proc/<pid>/cgroup: v2's `0::<path>`, else v1's memory
    controller's. None: neither is there."""
    v1 = None
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "" and path.startswith("/"):
            return CGROUP_ROOT + path.rstrip("/")
        if "memory" in controllers.split(",") and path.startswith("/"):
            v1 = f"{CGROUP_ROOT}/memory{path.rstrip('/')}"
    return v1


@dataclass(frozen=True)
class HardLimit:
    """One container's limit on one GPU, for its cgroup."""

    container_id: str
    container: str  # namespace/pod/container, for the log and the condition
    uuid: str
    soft_bytes: int
    hard_bytes: int


def wanted(containers: Iterable[RunningContainer], gpus: Sequence[GpuInfo]) -> list[HardLimit]:
    """Every annotated fraction with a limit, per GPU it names (a DRA claim's share has no container of its own)."""
    limits = []
    for c in containers:
        if c.claim or c.fraction.limit_mib is None or not c.container_id:
            continue
        for entry in c.fraction.devices:
            uuid = gpu_uuid(entry, gpus)
            if uuid is not None:
                limits.append(HardLimit(c.container_id, f"{c.namespace}/{c.pod}/{c.container}", uuid,
                                        (c.fraction.request_mib or 0) * MIB, c.fraction.limit_mib * MIB))
    return limits


def boundary(mode: ComputeMode, containers: Iterable[RunningContainer], verified: Collection[str],
             capable: bool) -> Boundary:
    """A mode's boundary on this node: `hard` where the driver can hold a cgroup limit and every placed fraction of
    the mode with a limit has it set and read back (`verified`: container IDs); else sm-sharing's MPS limits are
    cooperative, and time-slicing's env limits are nothing a process must keep."""
    placed = [c for c in containers if c.mode is mode and not c.claim and c.fraction.limit_mib is not None]
    if capable and all(c.container_id in verified for c in placed):
        return Boundary.HARD
    return Boundary.COOPERATIVE if mode is ComputeMode.SM_SHARING else Boundary.NONE


def labels(boundaries: dict[ComputeMode, Boundary]) -> dict[str, str]:
    return {f"{BOUNDARY_LABEL_PREFIX}{mode}": str(value) for mode, value in boundaries.items()}


def held_by(containers: Iterable[RunningContainer], gpus: Sequence[GpuInfo],
            verified: Collection[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """For the audit's over-limit report: what holds each placed fraction's memory on each of its GPUs."""
    out = {}
    for c in containers:
        for uuid in filter(None, (gpu_uuid(entry, gpus) for entry in c.fraction.devices)):
            if (c.container_id, uuid) in verified:
                out[(c.container_id, uuid)] = "its cgroup limit, set through NVML and read back (hard)"
            elif c.mode is ComputeMode.SM_SHARING:
                out[(c.container_id, uuid)] = "the MPS daemon side only (cooperative)"
            else:
                out[(c.container_id, uuid)] = "its env only (nothing a process must keep)"
    return out
