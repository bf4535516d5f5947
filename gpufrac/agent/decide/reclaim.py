"""Reclaiming GPU memory used above a request when a neighbour needs its guaranteed share. Pure.

A fraction is a range: its request is guaranteed, and it may grow to its limit while memory is free. Per GPU, the
memory still owed to containers below their requests (request - used, for each) must fit in what is free (NVML's
free: the driver's reserve is never free). When it does not (a *shortfall*), the pods whose containers use more than
their requests on that GPU are the candidates: lowest pod priority first, then the youngest (started last), each
freeing all its containers' memory on that GPU when evicted. The agent's edge evicts them in that order until what
they free covers the shortfall.

Against flapping, each GPU's contention is an *episode*: it starts when a shortfall appears, and ends only when
the owed memory fits with `hysteresis_bytes` to spare. Nothing is done until an episode has lasted
`grace_seconds`; after acting, the agent waits `grace_seconds` again before acting on that GPU (the evicted pods
take time to go). Usage hovering at the threshold therefore neither starts nor ends episodes on every pass.
With policy `off` an episode is reported once (what reclaim would have done) and nothing is evicted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from gpufrac.agent.decide.audit import AttributedProcess, device_assigned
from gpufrac.agent.decide.model import GpuInfo, GpuMemory, RunningContainer
from gpufrac.core.contract import MIB


class ReclaimPolicy(StrEnum):
    OFF = "off"  # report what would be reclaimed (an Event and a metric), evict nothing
    EVICT = "evict"  # evict pods above their request through the Eviction API (PodDisruptionBudgets honoured)


@dataclass(frozen=True)
class ReclaimSettings:
    policy: ReclaimPolicy = ReclaimPolicy.OFF
    grace_seconds: float = 30.0
    hysteresis_bytes: int = 256 * MIB


@dataclass(frozen=True)
class PodFacts:
    """What orders reclaim candidates: the pod's priority (spec.priority, 0 when unset) and when it started."""

    name: str
    priority: int
    started: float  # seconds since the epoch
    terminating: bool = False  # deleted already (an eviction under way): its memory is being freed


@dataclass(frozen=True)
class Tenant:
    """A running fractional container's share of one GPU."""

    container: RunningContainer
    request_bytes: int
    used_bytes: int

    @property
    def owed_bytes(self) -> int:
        """What its request still guarantees it on this GPU."""
        return max(0, self.request_bytes - self.used_bytes)

    @property
    def above_request_bytes(self) -> int:
        return max(0, self.used_bytes - self.request_bytes)


@dataclass(frozen=True)
class Candidate:
    """A pod that may be evicted for a GPU: what it uses there, and how much of it is above its requests."""

    namespace: str
    pod: str
    pod_uid: str
    priority: int
    started: float
    used_bytes: int
    above_request_bytes: int
    terminating: bool = False  # going already: counted as freeing its memory, never evicted again


@dataclass(frozen=True)
class GpuShare:
    """One GPU as reclaim sees it."""

    gpu_uuid: str
    free_bytes: int
    tenants: tuple[Tenant, ...]

    @property
    def owed_bytes(self) -> int:
        return sum(t.owed_bytes for t in self.tenants)

    @property
    def shortfall_bytes(self) -> int:
        """Owed minus free: positive when the guarantee does not fit."""
        return self.owed_bytes - self.free_bytes


@dataclass(frozen=True)
class Episode:
    """A GPU's contention, from its first shortfall to when the guarantee fits again."""

    since: float
    acted_at: float | None = None


@dataclass(frozen=True)
class ReclaimPlan:
    """What to do for one GPU now: evict `candidates` in order until `shortfall_bytes` are freed (policy evict), or
    report that (policy off). `owed` are the containers it is done for."""

    gpu_uuid: str
    shortfall_bytes: int
    free_bytes: int
    owed: tuple[Tenant, ...]
    candidates: tuple[Candidate, ...]
    policy: ReclaimPolicy


def shares(
    attributed: Iterable[AttributedProcess],
    running: Iterable[RunningContainer],
    gpus: Mapping[str, GpuInfo],
    memory: Mapping[str, GpuMemory],
) -> list[GpuShare]:
    """Per GPU with a memory reading: every running fractional container assigned to it or using it, with its
    request and what its processes use there."""
    used: dict[tuple[tuple[str, str, str], str], int] = {}
    owners: dict[tuple[str, str, str], RunningContainer] = {}
    for container in running:
        for gpu in gpus.values():
            if container.fraction.devices and device_assigned(container.fraction.devices, gpu):
                used.setdefault((container.key, gpu.uuid), 0)
                owners[container.key] = container
    for item in attributed:
        key = (item.container.key, item.process.gpu_uuid)
        used[key] = used.get(key, 0) + (item.process.used_bytes or 0)
        owners[item.container.key] = item.container
    by_gpu: dict[str, list[Tenant]] = {}
    for (container_key, gpu_uuid), used_bytes in used.items():
        container = owners[container_key]
        spec = container.fraction
        request_mib = spec.request_mib if spec.request_mib is not None else spec.limit_mib
        by_gpu.setdefault(gpu_uuid, []).append(Tenant(container, (request_mib or 0) * MIB, used_bytes))
    return [
        GpuShare(uuid, memory[uuid].free_bytes, tuple(sorted(tenants, key=lambda t: t.container.key)))
        for uuid, tenants in sorted(by_gpu.items())
        if uuid in memory
    ]


def candidates(share: GpuShare, pods: Mapping[str, PodFacts]) -> tuple[Candidate, ...]:
    """Pods with a container above its request on this GPU, in eviction order: lowest priority, then youngest."""
    used: dict[str, int] = {}
    above: dict[str, int] = {}
    names: dict[str, tuple[str, str]] = {}
    for tenant in share.tenants:
        c = tenant.container
        used[c.pod_uid] = used.get(c.pod_uid, 0) + tenant.used_bytes
        above[c.pod_uid] = above.get(c.pod_uid, 0) + tenant.above_request_bytes
        names[c.pod_uid] = (c.namespace, c.pod)
    found = []
    for uid, extra in above.items():
        if extra <= 0:
            continue
        facts = pods.get(uid, PodFacts(names[uid][1], 0, 0.0))
        found.append(Candidate(names[uid][0], names[uid][1], uid, facts.priority, facts.started, used[uid], extra,
                               facts.terminating))
    return tuple(sorted(found, key=lambda c: (c.priority, -c.started, c.namespace, c.pod)))


def decide(
    gpu_shares: Sequence[GpuShare],
    pods: Mapping[str, PodFacts],
    episodes: Mapping[str, Episode],
    now: float,
    settings: ReclaimSettings,
) -> tuple[list[ReclaimPlan], dict[str, Episode]]:
    """The plans to carry out now, and each GPU's episode after this pass (the caller keeps them for the next)."""
    plans: list[ReclaimPlan] = []
    after: dict[str, Episode] = {}
    for share in gpu_shares:
        shortfall = share.shortfall_bytes
        episode = episodes.get(share.gpu_uuid)
        if shortfall <= -settings.hysteresis_bytes:
            continue  # the guarantee fits with room to spare: any episode is over
        if episode is None:
            if shortfall <= 0:
                continue
            episode = Episode(since=now)
        after[share.gpu_uuid] = episode
        if shortfall <= 0 or now - episode.since < settings.grace_seconds:
            continue  # within the band, or not yet held for the grace period
        if episode.acted_at is not None and (
            settings.policy is ReclaimPolicy.OFF or now - episode.acted_at < settings.grace_seconds
        ):
            continue  # reported once (off), or waiting for the last evictions to free their memory
        found = candidates(share, pods)
        plans.append(
            ReclaimPlan(
                share.gpu_uuid,
                shortfall,
                share.free_bytes,
                tuple(t for t in share.tenants if t.owed_bytes > 0),
                found,
                settings.policy,
            )
        )
        after[share.gpu_uuid] = replace(episode, acted_at=now)
    return plans, after


def to_evict(plan: ReclaimPlan, refused: Iterable[str] = ()) -> list[Candidate]:
    """The candidates to evict, in order, skipping those refused (uids), until what they use covers the shortfall.
    Pods going already count as freeing what they use, and are not evicted again."""
    skip = set(refused)
    chosen: list[Candidate] = []
    freed = sum(c.used_bytes for c in plan.candidates if c.terminating)
    for candidate in plan.candidates:
        if freed >= plan.shortfall_bytes:
            break
        if candidate.pod_uid in skip or candidate.terminating:
            continue
        chosen.append(candidate)
        freed += candidate.used_bytes
    return chosen
