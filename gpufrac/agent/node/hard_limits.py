"""The agent's hold on each fractional container's cgroup limit (decide.hard_limits): set through NVML on the
container's own cgroup, read back, and the boundary each mode has on the node as a label.

A container's cgroup is found from one of its processes (/proc/<pid>/cgroup), so the limit is set on the pass after
its first process appears (within the loop's interval); the toolkit's hook, where the CDI spec carries it, sets it
before. Once read back equal, a container is not set again; what NVML refused is `problem`, for the condition."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from gpufrac.agent.decide import hard_limits
from gpufrac.agent.decide.errors import NvmlError
from gpufrac.agent.decide.hard_limits import Boundary, HardLimit
from gpufrac.agent.decide.model import GpuInfo, RunningContainer
from gpufrac.agent.edges.procfs import container_cgroups
from gpufrac.core.annotations import ComputeMode

log = logging.getLogger(__name__)


class MemoryLimitSource(Protocol):
    def set_memory_limits(self, uuid: str, cgroup: str, soft: int, hard: int) -> tuple[int, int]: ...


class CgroupLimits:
    def __init__(self, nvml: MemoryLimitSource, proc_root: Path) -> None:
        self.nvml = nvml
        self.proc_root = proc_root
        self.verified: dict[tuple[str, str], str] = {}  # (container ID, GPU) -> the cgroup held
        self.failed: dict[str, str] = {}  # container ID -> why its limit is not held
        self.problem: str | None = None
        self._probed: tuple[str, str | None] | None = None  # (driver version, why it holds no cgroup limit)

    def apply(self, containers: Iterable[RunningContainer], gpus: Sequence[GpuInfo],
              unable: str | None = None) -> str | None:
        """Each fraction's limit on its cgroup, set and read back; `unable`: why the driver holds none here (the
        probe's answer), then nothing is tried (no /proc scan, no NVML call) and each fraction is said unheld."""
        limits = hard_limits.wanted(containers, gpus)
        live = {(x.container_id, x.uuid) for x in limits}
        self.verified = {key: path for key, path in self.verified.items() if key in live}
        todo = [x for x in limits if (x.container_id, x.uuid) not in self.verified]
        self.failed = {}
        if unable is not None:
            self.failed = {x.container_id: f"{x.container}: the driver holds no limit on its cgroup ({unable})"
                           for x in todo}
            todo = []
        cgroups = container_cgroups(self.proc_root, {x.container_id for x in todo}) if todo else {}
        for limit in todo:
            text = cgroups.get(limit.container_id)
            if text is not None:
                self._hold(limit, hard_limits.cgroup_dir(text))
        self.problem = "; ".join(sorted(set(self.failed.values()))) or None
        return self.problem

    def _hold(self, limit: HardLimit, cgroup: str | None) -> None:
        if cgroup is None:
            self.failed[limit.container_id] = f"{limit.container}: its cgroup is not known"
            return
        try:
            soft, hard = self.nvml.set_memory_limits(limit.uuid, cgroup, limit.soft_bytes, limit.hard_bytes)
        except NvmlError as err:
            self.failed[limit.container_id] = f"{limit.container}: the driver holds no limit on its cgroup ({err})"
            return
        if hard != limit.hard_bytes:
            self.failed[limit.container_id] = (f"{limit.container}: the driver reads back {hard} bytes on {cgroup}, "
                                               f"not its limit {limit.hard_bytes}")
            return
        self.verified[(limit.container_id, limit.uuid)] = cgroup
        log.info("%s held to %d MiB on GPU %s by its cgroup %s (soft %d MiB)", limit.container,
                 hard >> 20, limit.uuid, cgroup, soft >> 20)

    def probe(self, gpus: Sequence[GpuInfo], driver_version: str) -> str | None:
        """Whether the driver holds a cgroup limit at all on this node, once per driver: "no limit" (soft 0, hard
        the most) set on the agent's own cgroup and read back. None: it does; else why not."""
        if self._probed is not None and self._probed[0] == driver_version:
            return self._probed[1]
        why: str | None = "no GPU to ask"
        own = hard_limits.cgroup_dir(_own_cgroup())
        if gpus and own is None:
            why = "the agent's own cgroup is not known"
        elif gpus and own is not None:
            try:
                got = self.nvml.set_memory_limits(gpus[0].uuid, own, 0, hard_limits.NO_LIMIT)
                why = None if got[1] == hard_limits.NO_LIMIT else f"the driver read back {got[1]}, not no limit"
            except NvmlError as err:
                why = str(err)
        self._probed = (driver_version, why)
        return why

    def boundaries(self, containers: Sequence[RunningContainer], modes: Iterable[ComputeMode],
                   capable: bool) -> dict[ComputeMode, Boundary]:
        pending = {c.container_id for c in containers} - {cid for cid, _ in self.verified} - set(self.failed)
        verified = {cid for cid, _ in self.verified} | pending  # pending: no process yet, set on its first pass
        return {mode: hard_limits.boundary(mode, containers, verified - set(self.failed), capable)
                for mode in modes}


def _own_cgroup() -> str:
    try:
        return Path("/proc/self/cgroup").read_text(errors="replace")
    except OSError:
        return ""
