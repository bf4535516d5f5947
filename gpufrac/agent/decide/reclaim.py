"""Reclaiming GPU memory used above a request when a neighbour needs its guaranteed share. Pure.

A fraction is a range: its request is guaranteed, and it may grow to its limit while memory is free. Per GPU, the
memory still owed to containers below their requests (request - used, for each) must fit in what is free (NVML's
free: the driver's reserve is never free). Owed are all the containers of the pods bound to the node, from bind on
(`owed`): one that crash-loops because it could not allocate its request is owed exactly as much as one running.
When the owed memory does not fit (a *shortfall*), the candidates are the pods that use more than their requests on
that GPU and are owed nothing there themselves; the victim order is:

1. only pods above their requests on that GPU (a pod at or below its request is never evicted);
2. the lowest pod priority first (pods at or above `protected_priority` are never evicted);
3. then the youngest (started last);
4. no more of a gang's members than it can lose and keep its minimum (`gangs`), unless `evict_gang_members`.

The loop that evicts takes one victim at a time (`next_victim`), feeding back the pods whose eviction was refused
and those going already (evicted, terminating, gone): their memory is counted as being freed.

Against flapping, each GPU's contention is an *episode*: it starts when a shortfall appears, and ends only when
the owed memory fits with `hysteresis_bytes` to spare. Nothing is done until the shortfall has been seen by every
pass for `grace_seconds` (the window): a single pass that sees the owed memory fit starts the window over, so two
short spikes never add up. After acting, the agent waits `grace_seconds` again before acting on that GPU (the
evicted pods take time to go). With policy `off` an episode is reported once and nothing is evicted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from gpufrac.agent.decide.attribution import AttributedProcess
from gpufrac.agent.decide.audit import device_assigned
from gpufrac.agent.decide.gangs import Gang
from gpufrac.agent.decide.model import GpuInfo, GpuMemory, GpuProcess, RunningContainer
from gpufrac.agent.decide.proc_text import pod_uids_in_cgroup
from gpufrac.core.contract import MIB
from gpufrac.core.owners import Owner


class ReclaimPolicy(StrEnum):
    OFF = "off"  # report what would be reclaimed (an Event and a metric), evict nothing
    EVICT = "evict"  # evict pods above their request through the Eviction API (PodDisruptionBudgets honoured)


@dataclass(frozen=True)
class ReclaimSettings:
    policy: ReclaimPolicy = ReclaimPolicy.OFF
    grace_seconds: float = 30.0  # the window a shortfall must last, and the wait after acting
    hysteresis_bytes: int = 256 * MIB
    protected_priority: int | None = None  # pods at or above this priority are never evicted
    evict_gang_members: bool = False  # True: a gang's members are candidates like any pod, its minimum or not
    backoff_seconds: float = 600.0  # an evicted pod's controller is kept off the node this long (0: not at all)
    victim_grace_seconds: int | None = 30  # an evicted pod's grace period (None: its terminationGracePeriodSeconds)


@dataclass(frozen=True)
class UsageReading:
    """What GPU processes use and how much memory is free, read together (one moment, not two)."""

    processes: tuple[GpuProcess, ...]
    memory: Mapping[str, GpuMemory]


@dataclass(frozen=True)
class PodFacts:
    """What orders reclaim candidates: the pod's priority (spec.priority, 0 when unset) and when it started."""

    name: str
    priority: int
    started: float  # seconds since the epoch
    terminating: bool = False  # deleted already (an eviction under way): its memory is being freed
    pod_group: str = ""  # the KAI PodGroup it names (gangs.pod_group)
    gang: Gang | None = None  # that PodGroup as read (None: none, or not read: no gang)
    sub_group: str = ""  # the leaf sub-group of it that it names (gangs.sub_group)
    sub_gang: Gang | None = None  # that sub-group as read (gangs.read_sub_gang; None: none)
    owner: Owner | None = None  # its controller, told when the pod is evicted (None: a bare pod)
    unread: bool = False  # the API server did not answer for it (a claim's pod): never a victim (fail closed)


@dataclass(frozen=True)
class Tenant:
    """An owed fractional container's share of one GPU."""

    container: RunningContainer
    request_bytes: int
    used_bytes: int
    owed: bool = True  # False: seen using the GPU, but owed nothing (its pod is going, or it will not run again)

    @property
    def owed_bytes(self) -> int:
        """What its request still guarantees it on this GPU."""
        return max(0, self.request_bytes - self.used_bytes) if self.owed else 0

    @property
    def may_hide_use(self) -> bool:
        """Whether some of its use may be in NVML's used memory uncharged to it: it has processes (a container
        created, or a claim's pods) whose usage NVML did not tell, whose cgroup was not read, or that MPS charges to
        its server."""
        return bool(self.container.container_id or self.container.claim)

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
    owner: Owner | None = None  # its controller (PodFacts.owner)


@dataclass(frozen=True)
class GpuShare:
    """One GPU as reclaim sees it."""

    gpu_uuid: str
    free_bytes: int
    tenants: tuple[Tenant, ...]
    unattributed_bytes: int = 0  # in use, charged to no tenant, and not known to be anyone else's

    @property
    def owed_bytes(self) -> int:
        """What the requests still guarantee, less the unattributed use that may be theirs: that memory has left
        `free` already, so it is counted once, against the GPU, not again as owed to a request."""
        owed = sum(t.owed_bytes for t in self.tenants)
        hiding = sum(t.owed_bytes for t in self.tenants if t.may_hide_use)
        return owed - min(self.unattributed_bytes, hiding)

    @property
    def shortfall_bytes(self) -> int:
        """Owed minus free: positive when the guarantee does not fit."""
        return self.owed_bytes - self.free_bytes


@dataclass(frozen=True)
class Episode:
    """A GPU's contention, from its first shortfall to when the guarantee fits again with room to spare.
    `short_since`: when the current unbroken run of passes with a shortfall began (None: the last pass had none)."""

    since: float
    acted_at: float | None = None
    short_since: float | None = None


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


def _assigned(containers: Iterable[RunningContainer], gpus: Mapping[str, GpuInfo]) -> Iterable[tuple[
        RunningContainer, str]]:
    for container in containers:
        for gpu in gpus.values():
            if device_assigned(container.fraction.devices, gpu):  # no devices, or MIG: not comparable
                yield container, gpu.uuid


def shares(
    attributed: Iterable[AttributedProcess],
    owed: Iterable[RunningContainer],
    gpus: Mapping[str, GpuInfo],
    memory: Mapping[str, GpuMemory],
    others: Mapping[str, int] | None = None,
) -> list[GpuShare]:
    """Per GPU with a memory reading: every owed container assigned to it, and every fractional container using
    it, with its request and what its processes use there; only the containers in `owed` are owed anything. A
    process listed twice (same PID, same GPU) is counted once. What NVML counts as used but no tenant is charged for
    (a usage NVML did not tell, a cgroup not read, a client charged to its MPS server), less what is known to be no
    tenant's (`others`, by GPU: the MPS servers' own context, processes of no fraction), is the GPU's unattributed
    use."""
    used: dict[tuple[tuple[str, str, str], str], int] = {}
    owners: dict[tuple[str, str, str], RunningContainer] = {}
    owed_keys: set[tuple[str, str, str]] = set()
    for container, uuid in _assigned(owed, gpus):
        used.setdefault((container.key, uuid), 0)
        owners[container.key] = container
        owed_keys.add(container.key)
    seen: set[tuple[int, str]] = set()
    for item in attributed:
        if (item.process.pid, item.process.gpu_uuid) in seen:
            continue
        seen.add((item.process.pid, item.process.gpu_uuid))
        key = (item.container.key, item.process.gpu_uuid)
        used[key] = used.get(key, 0) + (item.process.used_bytes or 0)
        owners.setdefault(item.container.key, item.container)
    by_gpu: dict[str, list[Tenant]] = {}
    for (container_key, gpu_uuid), used_bytes in used.items():
        spec = owners[container_key].fraction
        request_mib = spec.request_mib if spec.request_mib is not None else spec.limit_mib
        by_gpu.setdefault(gpu_uuid, []).append(Tenant(owners[container_key], (request_mib or 0) * MIB, used_bytes,
                                                      owed=container_key in owed_keys))
    known_others = others or {}
    return [
        GpuShare(uuid, memory[uuid].free_bytes, tuple(sorted(tenants, key=lambda t: t.container.key)),
                 max(0, memory[uuid].used_bytes - sum(t.used_bytes for t in tenants) - known_others.get(uuid, 0)))
        for uuid, tenants in sorted(by_gpu.items())
        if uuid in memory
    ]


def others_use(processes: Iterable[GpuProcess], attributed: Iterable[AttributedProcess], cgroups: Mapping[int, str],
               tenant_pods: Iterable[str], servers: Iterable[int]) -> dict[str, int]:
    """Per GPU, what processes known to be no tenant's use: their usage told, their cgroup read and naming no
    tenant's pod, not an MPS server (whose use may be its clients'). The rest of NVML's used memory that no tenant is
    charged for may be a tenant's (`GpuShare.unattributed_bytes`)."""
    charged = {(a.process.pid, a.process.gpu_uuid) for a in attributed}
    pods, skip = set(tenant_pods), set(servers)
    found: dict[str, int] = {}
    for process in processes:
        text = cgroups.get(process.pid)
        if process.used_bytes is None or text is None or process.pid in skip or \
                (process.pid, process.gpu_uuid) in charged or pod_uids_in_cgroup(text) & pods:
            continue
        found[process.gpu_uuid] = found.get(process.gpu_uuid, 0) + process.used_bytes
    return found


_UNKNOWN_POD = PodFacts("", 0, 0.0)  # a pod not in the agent's list (yet): priority 0, the oldest


def _protected(facts: PodFacts, settings: ReclaimSettings) -> bool:
    return settings.protected_priority is not None and facts.priority >= settings.protected_priority


def candidates(share: GpuShare, pods: Mapping[str, PodFacts],
               settings: ReclaimSettings = ReclaimSettings()) -> tuple[Candidate, ...]:
    """Pods above their requests on this GPU and owed nothing there, in eviction order: lowest priority, then
    youngest. Pods at or above the protected priority, and those whose facts could not be read, are left out."""
    used: dict[str, int] = {}
    above: dict[str, int] = {}
    owed: set[str] = set()
    names: dict[str, tuple[str, str]] = {}
    for tenant in share.tenants:
        c = tenant.container
        used[c.pod_uid] = used.get(c.pod_uid, 0) + tenant.used_bytes
        above[c.pod_uid] = above.get(c.pod_uid, 0) + tenant.above_request_bytes
        names[c.pod_uid] = (c.namespace, c.pod)
        if tenant.owed_bytes > 0:
            owed.add(c.pod_uid)  # evicting a pod that is owed memory would not keep its guarantee
    found = []
    for uid, extra in above.items():
        facts = pods.get(uid, _UNKNOWN_POD)
        if extra <= 0 or uid in owed or facts.unread or _protected(facts, settings):
            continue
        found.append(Candidate(names[uid][0], names[uid][1], uid, facts.priority, facts.started, used[uid], extra,
                               facts.terminating, facts.owner))
    ordered = sorted(found, key=lambda c: (c.priority, -c.started, c.namespace, c.pod))
    return tuple(ordered if settings.evict_gang_members else _within_gangs(ordered, pods))


def _within_gangs(ordered: Sequence[Candidate], pods: Mapping[str, PodFacts]) -> list[Candidate]:
    """The candidates, in order, but no more of a gang's members than it can lose, nor of its sub-group's. A member
    going already stays (its memory is being freed) and counts against what its gang and sub-group can lose."""
    taken: dict[tuple[str, str], int] = {}
    kept = []
    for candidate in ordered:
        facts = pods.get(candidate.pod_uid, _UNKNOWN_POD)
        limited = [(g, g.spare) for g in (facts.gang, facts.sub_gang) if g is not None and g.spare is not None]
        if not candidate.terminating and any(taken.get((g.namespace, g.name), 0) >= spare for g, spare in limited):
            continue
        for gang, _ in limited:
            taken[(gang.namespace, gang.name)] = taken.get((gang.namespace, gang.name), 0) + 1
        kept.append(candidate)
    return kept


def plan(share: GpuShare, pods: Mapping[str, PodFacts], settings: ReclaimSettings) -> ReclaimPlan | None:
    """What one reading of a GPU asks for: None when the owed memory fits."""
    if share.shortfall_bytes <= 0:
        return None
    return ReclaimPlan(share.gpu_uuid, share.shortfall_bytes, share.free_bytes,
                       tuple(t for t in share.tenants if t.owed_bytes > 0), candidates(share, pods, settings),
                       settings.policy)


def _advance(episode: Episode | None, shortfall: int, now: float) -> Episode | None:
    """The episode after a pass that saw `shortfall` (not yet ended by the hysteresis)."""
    if episode is None:
        return Episode(since=now, short_since=now) if shortfall > 0 else None
    if shortfall <= 0:
        return replace(episode, short_since=None)  # the shortage was broken: the window starts over
    if episode.short_since is None:
        return replace(episode, short_since=now)
    return episode


def _due(episode: Episode, now: float, settings: ReclaimSettings) -> bool:
    if episode.short_since is None or now - episode.short_since < settings.grace_seconds:
        return False  # no shortage now, or not yet held for the whole window
    if episode.acted_at is None:
        return True
    # reported once (off), or waiting for the last evictions to free their memory
    return settings.policy is ReclaimPolicy.EVICT and now - episode.acted_at >= settings.grace_seconds


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
        if share.shortfall_bytes <= -settings.hysteresis_bytes:
            continue  # the guarantee fits with room to spare: any episode is over
        episode = _advance(episodes.get(share.gpu_uuid), share.shortfall_bytes, now)
        if episode is None:
            continue
        after[share.gpu_uuid] = episode
        made = plan(share, pods, settings) if _due(episode, now, settings) else None
        if made is not None:
            plans.append(made)
            after[share.gpu_uuid] = replace(episode, acted_at=now)
    return plans, after


def covered(plan: ReclaimPlan, going: Iterable[str] = ()) -> bool:
    """Whether the pods going already (terminating, or `going`: evicted or gone this pass) free the shortfall."""
    gone = set(going)
    freeing = sum(c.used_bytes for c in plan.candidates if c.terminating or c.pod_uid in gone)
    return freeing >= plan.shortfall_bytes


def next_victim(plan: ReclaimPlan, refused: Iterable[str] = (), going: Iterable[str] = ()) -> Candidate | None:
    """The next pod to evict: the first candidate not refused (uids: PDB, failed) and not going already; None when
    those going cover the shortfall, or no candidate is left."""
    gone = set(going)
    if covered(plan, gone):
        return None
    skip = set(refused) | gone
    return next((c for c in plan.candidates if c.pod_uid not in skip and not c.terminating), None)


def to_evict(plan: ReclaimPlan, refused: Iterable[str] = ()) -> list[Candidate]:
    """The whole order `next_victim` gives on one reading, when every eviction succeeds (what policy off reports)."""
    chosen: list[Candidate] = []
    while (victim := next_victim(plan, refused, [c.pod_uid for c in chosen])) is not None:
        chosen.append(victim)
    return chosen
