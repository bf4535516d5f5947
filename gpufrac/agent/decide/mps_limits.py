"""The sm-sharing daemon's own limits: what no client can raise. Pure.

A client's env (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`) can only lower what its MPS
server allows, and a client that drops or garbles it (`env -i`, a narrowed `CUDA_VISIBLE_DEVICES` under index keys)
gets whatever the server allows: the whole GPU, unless the daemon side says otherwise. So the agent tells the
sm-sharing daemon, through the documented control commands (nvidia-cuda-mps-control(1)), the limits of its
servers:

- `set_default_device_pinned_mem_limit <uuid> <MiB>M` and `set_default_active_thread_percentage <pct>`: for the next
  server the daemon spawns;
- `set_device_pinned_mem_limit <server pid> <uuid> <MiB>M` and `set_active_thread_percentage <server pid> <pct>`: for
  a server already running (the defaults do not reach it).

The sm-sharing daemon runs one multi-user server that shares its context among every client of a GPU (that is
what sm-sharing is), and a server's limits are per server and device, not per client. So the daemon side holds a
GPU's clients to the largest limit of the sm-sharing fractions bound to it, and the thread percentage to the largest
of the node's. Where a GPU's fractions have one limit (an equal split) that is each container's own; where they
differ, a container with a smaller limit is held on the daemon side only to its largest neighbour's, and to its own by
its client env (keyed by UUID, so a narrowed view does not drop it) and the agent's container total (over-limit
action). On MPS v3 (r615+) each container is also given a namespace of its own, which closes that gap
(mps_namespaces); where it is not (a legacy driver, a DRA claim's share), `holds` says so, for the node's condition.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpufrac.agent.decide.model import GpuInfo, RunningContainer
from gpufrac.core.annotations import ComputeMode, device_id
from gpufrac.core.contract import NO_COMPUTE_CAP


@dataclass(frozen=True)
class GpuCeiling:
    """One GPU's daemon-side pinned memory limit, and the containers whose limits it stands for."""

    uuid: str
    pinned_mib: int
    limits: Mapping[str, int]  # container (`namespace/pod/container`) -> its own limit, MiB


@dataclass(frozen=True)
class DaemonPlan:
    """What the sm-sharing daemon is told. Empty: no sm-sharing fraction on this node (nothing to hold)."""

    ceilings: tuple[GpuCeiling, ...] = ()
    thread_percent: int | None = None
    thread_percents: Mapping[str, int] | None = None  # container -> its own percentage
    unknown_devices: tuple[str, ...] = ()  # gpus.devices entries NVML does not know: no daemon-side limit for them

    def default_commands(self) -> list[str]:
        commands = [f"set_default_device_pinned_mem_limit {c.uuid} {c.pinned_mib}M" for c in self.ceilings]
        if self.thread_percent is not None:
            commands.append(f"set_default_active_thread_percentage {self.thread_percent}")
        return commands

    def server_commands(self, server_pids: Iterable[int]) -> list[str]:
        commands = []
        for pid in server_pids:
            commands += [f"set_device_pinned_mem_limit {pid} {c.uuid} {c.pinned_mib}M" for c in self.ceilings]
            if self.thread_percent is not None:
                commands.append(f"set_active_thread_percentage {pid} {self.thread_percent}")
        return commands


def plan(containers: Iterable[RunningContainer], gpus: Sequence[GpuInfo]) -> DaemonPlan:
    """The daemon-side limits for the node's running sm-sharing fractions."""
    per_gpu: dict[str, dict[str, int]] = {}
    threads: dict[str, int] = {}
    unknown: list[str] = []
    for c in containers:
        if c.mode is not ComputeMode.SM_SHARING or c.fraction.limit_mib is None:
            continue
        name = f"{c.namespace}/{c.pod}/{c.container}"
        threads[name] = c.fraction.active_thread_percent or NO_COMPUTE_CAP
        for entry in c.fraction.devices:
            uuid = gpu_uuid(entry, gpus)
            if uuid is None:
                unknown.append(entry)
                continue
            per_gpu.setdefault(uuid, {})[name] = c.fraction.limit_mib
    ceilings = tuple(GpuCeiling(uuid, max(limits.values()), dict(sorted(limits.items())))
                     for uuid, limits in sorted(per_gpu.items()))
    return DaemonPlan(ceilings, max(threads.values()) if threads else None, dict(sorted(threads.items())),
                      tuple(sorted(set(unknown))))


def gpu_uuid(entry: str, gpus: Sequence[GpuInfo]) -> str | None:
    """The UUID of the GPU a `gpus.devices` entry names (a UUID, an index, a CDI name ending in one), None: unknown."""
    identifier = device_id(entry)
    return next((g.uuid for g in gpus if identifier in (g.uuid, str(g.index))), None)


def holds(daemon_plan: DaemonPlan, *, applied: bool, routed: frozenset[str] = frozenset()) -> str | None:
    """For the node's condition: what the daemon side does not hold (None: it holds every container's limits).
    `routed`: the containers (`namespace/pod/container`) held by an MPS v3 namespace of their own (mps_namespaces),
    whatever their server's limits."""
    if not applied and (daemon_plan.ceilings or daemon_plan.thread_percent is not None):
        return ("the sm-sharing MPS daemon did not take its limits: each container's memory and thread limits rest on "
                "its client env and the agent's container total, which a process can lift until the agent acts")
    gaps = [f"GPU {c.uuid} holds clients to {c.pinned_mib}Mi, the largest of {', '.join(_listed(c.limits, 'Mi'))}"
            for c in daemon_plan.ceilings if _below(c.limits, c.pinned_mib, routed)]
    percents = daemon_plan.thread_percents or {}
    if daemon_plan.thread_percent is not None and _below(percents, daemon_plan.thread_percent, routed):
        gaps.append(f"threads are held to {daemon_plan.thread_percent}%, the largest of "
                    f"{', '.join(_listed(percents, '%'))}")
    if daemon_plan.unknown_devices:
        gaps.append(f"devices NVML does not know ({', '.join(daemon_plan.unknown_devices)}) have no daemon-side limit")
    if not gaps:
        return None
    return ("the sm-sharing MPS daemon holds each GPU's clients to one limit per server, not per container: "
            + "; ".join(gaps) + "; a smaller container is held to its own by its client env and the agent's "
            "container total" + ("" if routed else " (MPS v3 namespaces per container, on r615+ drivers, would hold "
                                 "it on the daemon side)"))


def _below(limits: Mapping[str, int], held: int, routed: frozenset[str]) -> bool:
    """Whether a container not held by a namespace of its own has a smaller limit than its server's."""
    return any(value < held for name, value in limits.items() if name not in routed)


def _listed(values: Mapping[str, int], unit: str) -> list[str]:
    return [f"{name} {value}{unit}" for name, value in values.items()]
