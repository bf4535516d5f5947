"""Holding the range a fraction promises, at the node (edge): container totals, reclaim above request, usable capacity.

Each audit pass ends here. The decisions are pure (`overlimit`, `reclaim`, `capacity`); this module reads what they
need (NVML's memory, process start times), carries them out (a process killed, a pod evicted through the Eviction
API) and reports them (Events, metrics, the usable-memory node labels the agent publishes).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpufrac.agent.decide import capacity, reclaim, soft_limits
from gpufrac.agent.decide.attribution import AttributedProcess, attribute
from gpufrac.agent.decide.audit import Findings, Snapshot
from gpufrac.agent.decide.errors import NvmlError, ProcReadError
from gpufrac.agent.decide.events import EventSink, owner_event, pod_event
from gpufrac.agent.decide.model import (
    EnforcementViolation,
    EvictionOutcome,
    GpuMemory,
    GpuProcess,
    Inventory,
    RunningContainer,
    ViolationKind,
)
from gpufrac.agent.decide.overlimit import OverLimitAction, newest
from gpufrac.agent.decide.owed import owed_on_node
from gpufrac.agent.decide.pod_facts import pod_facts
from gpufrac.agent.decide.reclaim import (
    Candidate,
    GpuShare,
    PodFacts,
    ReclaimPlan,
    ReclaimPolicy,
    ReclaimSettings,
    Tenant,
    UsageReading,
)
from gpufrac.agent.decide.request_fit import admitted
from gpufrac.agent.decide.soft_limits import ReclaimBy
from gpufrac.agent.edges.metrics import AgentMetrics
from gpufrac.agent.edges.procfs import read_cgroup, read_parent_pid, read_start_time
from gpufrac.agent.node.backoffs import Backoffs
from gpufrac.agent.node.evictions import Evictions
from gpufrac.agent.node.gang_reader import GangReader
from gpufrac.core.contract import mib_ceil, mib_floor, reclaim_backoff_label
from gpufrac.kube.errors import KubeError

log = logging.getLogger(__name__)

RECLAIM_LABEL = "gpufrac.io/reclaim"  # on reclaim's Events: evicted, reclaimed-for, blocked, would-evict, short


@dataclass(frozen=True)
class GuaranteeConfig:
    over_limit_action: OverLimitAction = OverLimitAction.EVENT
    reclaim: ReclaimSettings = field(default_factory=ReclaimSettings)
    mps_context_keep_seconds: float = 3600.0  # how long a larger MPS context figure outlives smaller readings

    @property
    def may_evict(self) -> bool:
        return self.over_limit_action is OverLimitAction.EVICT or self.reclaim.policy is ReclaimPolicy.EVICT


class MemorySource(Protocol):
    def reading(self) -> UsageReading: ...


class GuaranteeKube(EventSink, Protocol):
    def request_eviction(self, namespace: str, name: str, *, uid: str = "",
                         grace_seconds: int | None = None) -> tuple[EvictionOutcome, str]: ...

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def get_pod_group(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def list_namespaced_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]: ...


def _mib(value: int) -> str:
    return f"{mib_ceil(max(0, value))} MiB"


def _owed_text(owed: Sequence[Tenant]) -> str:
    return ", ".join(
        f"{t.container.namespace}/{t.container.pod} ({'claim' if t.container.claim else 'container'} "
        f"{t.container.container}: "
        f"{_mib(t.owed_bytes)} of its {_mib(t.request_bytes)} request not yet used)"
        for t in owed
    )


class Guarantee:
    """One per agent; `measure` and `act` run once per audit pass."""

    def __init__(
        self,
        kube: GuaranteeKube,
        gpus: MemorySource,
        metrics: AgentMetrics,
        node: str,
        proc_root: Any,
        config: GuaranteeConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        kill: Callable[[int, int], None] = os.kill,
        mps_daemons: Callable[[], Iterable[int]] = tuple,
        reclaim_by: Callable[[], ReclaimBy] = lambda: ReclaimBy.AGENT,
        wall_clock: Callable[[], float] = time.time,
        hold_off: Callable[[], bool] = lambda: True,
    ) -> None:
        self._kube = kube
        self._gpus = gpus
        self._metrics = metrics
        self._node = node
        self._proc_root = proc_root
        self.config = config
        self._clock = clock
        self._kill = kill
        self._mps_daemons = mps_daemons  # the PIDs of the MPS control daemons the agent runs or supervises
        self._reclaim_by = reclaim_by  # the driver where it holds requests as soft limits: then the agent evicts none
        self._episodes: dict[str, reclaim.Episode] = {}
        self._mps_context: dict[str, capacity.Remembered] = {}  # the most each GPU's MPS servers were seen holding
        self._killed: set[tuple[int, int]] = set()  # (pid, start time): a killed process NVML still lists
        self._evicted: set[str] = set()  # pod UIDs evicted for their total
        self._claim_pods: dict[str, PodFacts | None] = {}  # by UID: the pods claims are for (None: not there)
        self._attributed: list[AttributedProcess] = []  # the last reading's processes of tenants
        self._above: dict[tuple[int, str], soft_limits.AboveRequest] = {}  # driver mode: above request at last pass
        self.labels: dict[str, str] = {}  # the usable-memory labels, published with the agent's others
        self.usable_mib: dict[str, int] = {}  # GPU UUID -> usable memory as of the last pass (what requests may fill)
        self.evictions = Evictions(kube, Backoffs(config.reclaim.backoff_seconds, wall_clock, hold_off),
                                   config.reclaim.victim_grace_seconds)
        self.backoffs = self.evictions.backoffs
        self._gangs = GangReader(kube)

    # ---- one pass ----

    def run(self, inventory: Inventory, snapshot: Snapshot, findings: Findings,
            pods: Sequence[Mapping[str, Any]]) -> None:
        self.evictions.new_pass()
        reading = self._read() or UsageReading((), {})
        usable = self.measure(inventory, reading.memory, reading.processes)
        self.hold_totals(findings.violations)
        shortfalls = self.reclaim(reading, snapshot, pods)
        self._metrics.gpu_memory.set(usable, shortfalls)

    def _read(self) -> UsageReading | None:
        try:
            return self._gpus.reading()
        except NvmlError as err:
            log.warning("%s", err)
            return None

    def measure(self, inventory: Inventory, memory: Mapping[str, GpuMemory],
                processes: Sequence[GpuProcess]) -> list[capacity.Usable]:
        """Usable memory per GPU; the labels are kept for the next publish. The MPS servers are the agent's own
        daemons' children (or in their cgroups), whatever any process calls itself; their context is remembered
        at its largest, a maximum that decays (`capacity.remember_contexts`)."""
        held = capacity.mps_contexts(processes, self._mps_servers(processes))
        self._mps_context = capacity.remember_contexts(self._mps_context, held, self._clock(),
                                                       self.config.mps_context_keep_seconds)
        usable = capacity.usable(inventory.gpus, memory, {u: r.held_bytes for u, r in self._mps_context.items()})
        self.labels = capacity.usable_labels(usable)
        self.usable_mib = {u.gpu.uuid: mib_floor(u.usable_bytes) for u in usable}
        return usable

    def _mps_servers(self, processes: Sequence[GpuProcess]) -> list[int]:
        daemons = {pid for pid in self._mps_daemons() if pid}
        daemon_cgroups = set()
        for pid in daemons:
            try:
                daemon_cgroups.add(read_cgroup(self._proc_root, pid))
            except ProcReadError:
                continue  # not visible from here: its children are still known by their parent
        servers = []
        for process in processes:
            try:
                if read_parent_pid(self._proc_root, process.pid) in daemons or \
                        read_cgroup(self._proc_root, process.pid) in daemon_cgroups:
                    servers.append(process.pid)
            except ProcReadError:
                continue  # exited meanwhile
        return servers

    # ---- container totals ----

    def hold_totals(self, violations: Sequence[EnforcementViolation]) -> None:
        over = [v for v in violations if v.kind is ViolationKind.MEMORY_OVER_LIMIT]
        self._metrics.containers_over_limit.set(len(over))
        for violation in over:
            if self.config.over_limit_action is OverLimitAction.KILL_NEWEST:
                self._kill_newest(violation)
            elif self.config.over_limit_action is OverLimitAction.EVICT:
                self._evict_over_limit(violation)

    def _start_times(self, pids: Iterable[int]) -> dict[int, int]:
        times = {}
        for pid in pids:
            try:
                times[pid] = read_start_time(self._proc_root, pid)
            except ProcReadError:
                continue  # exited meanwhile
        return times

    def _kill_newest(self, violation: EnforcementViolation) -> None:
        started = self._start_times(violation.pids)
        pid = newest(violation.pids, started)
        if pid is None or (pid, started[pid]) in self._killed:
            return  # gone, or killed already and not yet out of NVML's list
        if self._start_times([pid]).get(pid) != started[pid]:
            return  # the PID was reused meanwhile: not the process NVML counted
        c = violation.container
        try:
            self._kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except OSError as err:
            log.warning("killing process %d of %s/%s: %s", pid, c.namespace, c.pod, err)
            return
        self._killed.add((pid, started[pid]))
        self._metrics.over_limit_actions.labels(action=str(OverLimitAction.KILL_NEWEST), outcome="killed").inc()
        others = ", ".join(str(p) for p in violation.pids if p != pid) or "none"
        message = (
            f"killed GPU process {pid}, the newest of container {c.container}'s processes on "
            f"{violation.gpu_uuid} (enforcement.overLimitAction kill-newest); the others keep running ({others}): "
            f"{violation.message}"
        )
        log.warning("%s/%s: %s", c.namespace, c.pod, message)
        self._event(c.namespace, c.pod, c.pod_uid, "GPUProcessKilled", message, container=c.container,
                    labels={"gpufrac.io/over-limit": "kill-newest"})

    def _evict_over_limit(self, violation: EnforcementViolation) -> None:
        c = violation.container
        if c.pod_uid in self._evicted:
            return
        outcome, said = self.evictions.evict(c.namespace, c.pod, c.pod_uid)
        if outcome is None:
            return
        if outcome is EvictionOutcome.BLOCKED:
            self._metrics.over_limit_actions.labels(action="evict", outcome="blocked").inc()
            log.warning("evicting %s/%s for its GPU memory total was refused: %s", c.namespace, c.pod, said)
            return  # tried again next pass
        self._evicted.add(c.pod_uid)
        if outcome is EvictionOutcome.EVICTED:
            self._metrics.over_limit_actions.labels(action="evict", outcome="evicted").inc()
            self._event(c.namespace, c.pod, c.pod_uid, "GPUMemoryLimitEvicted",
                        f"evicted (enforcement.overLimitAction evict): {violation.message}", container=c.container,
                        labels={"gpufrac.io/over-limit": "evict"})

    # ---- reclaim above request ----

    def reclaim(self, reading: UsageReading, snapshot: Snapshot, pods: Sequence[Mapping[str, Any]]) -> dict[str, int]:
        """Decide (pure) on one reading and carry out; returns each GPU's shortfall, for the metric."""
        claim_pods = self._claim_pod_facts(snapshot.claims.tenants)
        # a claim is owed from Prepare on, unless its pod is going; a container the node refuses is owed nothing
        claims = [t for t in snapshot.claims.tenants if not (t.pod_uid in claim_pods and
                                                              claim_pods[t.pod_uid].terminating)]
        owed = admitted([*owed_on_node(pods), *claims], list(snapshot.gpus.values()), self.usable_mib)
        shares = self._shares(reading, snapshot, owed)
        if self._reclaim_by() is ReclaimBy.DRIVER:
            self._episodes = {}  # the driver takes memory above a request back: the agent only reports the shortfall
            self._driver_took(reading, shares)
            return {share.gpu_uuid: share.shortfall_bytes for share in shares}
        self._above = {}
        facts = pod_facts(pods) | claim_pods
        if not self.config.reclaim.evict_gang_members:
            facts = self._gangs.with_gangs(facts, shares)
        plans, self._episodes = reclaim.decide(shares, facts, self._episodes, self._clock(), self.config.reclaim)
        for plan in plans:
            self._carry_out(plan, lambda uuid: self._replan(uuid, snapshot, owed, facts))
        return {share.gpu_uuid: share.shortfall_bytes for share in shares}

    def _driver_took(self, reading: UsageReading, shares: Sequence[GpuShare]) -> None:
        """An Event for each process NVML no longer lists that was above its request at the last pass: the driver
        kills such a process with no grace and says nothing (soft_limits.ended)."""
        if not reading.memory:
            return  # NVML not read this pass: nothing can be said to have ended
        for gone in soft_limits.ended(self._above, reading.processes):
            t = gone.tenant
            self._metrics.reclaims.labels(outcome="driver-ended").inc()
            self._event(t.container.namespace, t.container.pod, t.container.pod_uid, "GPUProcessEndedAboveRequest",
                        f"GPU process {gone.pid} ended while its container used {_mib(t.used_bytes)} on "
                        f"{gone.gpu_uuid}, {_mib(t.above_request_bytes)} above its request of {_mib(t.request_bytes)}: "
                        "on this node the driver holds each request as a soft limit and kills a process above it, with "
                        "no grace, when a neighbour needs the memory (or it ended by itself)",
                        container=None if t.container.claim else t.container.container,
                        labels={RECLAIM_LABEL: "driver-ended"})
        self._above = soft_limits.above_request(shares, self._attributed)

    def _shares(self, reading: UsageReading, snapshot: Snapshot, owed: Sequence[Any]) -> list[GpuShare]:
        """The GPUs' shares from one reading: its processes attributed by their cgroups, read now."""
        by_id = {c.container_id: c for c in owed if c.container_id} | dict(snapshot.containers)
        cgroups = {}
        for process in reading.processes:
            try:
                cgroups[process.pid] = read_cgroup(self._proc_root, process.pid)
            except ProcReadError:
                continue  # exited since the reading
        attributed = attribute(reading.processes, by_id, cgroups, {}, snapshot.claims)
        # an MPS server's memory may be its clients' (a driver that charges them to it): never taken off what is owed
        others = reclaim.others_use(reading.processes, attributed, cgroups, {c.pod_uid for c in owed},
                                    self._mps_servers(reading.processes))
        self._attributed = attributed
        return reclaim.shares(attributed, owed, snapshot.gpus, reading.memory, others)

    def _claim_pod_facts(self, tenants: Sequence[RunningContainer]) -> dict[str, PodFacts]:
        """The facts of the pods the claims are for (the agent's pod list holds only annotated pods): read once per
        pod (its priority does not change; its going is what the evictions' answers say). A pod that is not there
        (a claim recorded without its pods names itself) is left to reclaim's defaults; one the API server did not
        answer for is no victim (fail closed: it may be protected, or a gang's) and is asked again at a later pass."""
        wanted = {t.pod_uid: t for t in tenants}
        self._claim_pods = {uid: f for uid, f in self._claim_pods.items() if uid in wanted}
        unread = {}
        for uid, tenant in wanted.items():
            if uid in self._claim_pods:
                continue
            try:
                pod = self._kube.get_pod(tenant.namespace, tenant.pod)
            except KubeError as err:
                unread[uid] = PodFacts(tenant.pod, 0, 0.0, unread=True)
                self._unread(tenant, str(err))
                continue
            found = pod is not None and (pod.get("metadata") or {}).get("uid") == uid
            self._claim_pods[uid] = pod_facts([pod])[uid] if found and pod is not None else None
        return {uid: f for uid, f in self._claim_pods.items() if f is not None} | unread

    def _unread(self, tenant: RunningContainer, why: str) -> None:
        log.warning("reading pod %s/%s of claim %s: %s", tenant.namespace, tenant.pod, tenant.claim, why)
        self._metrics.reclaims.labels(outcome="unread").inc()
        self._event(tenant.namespace, tenant.pod, tenant.pod_uid, "GPUReclaimPodUnread",
                    f"reclaim could not read this pod (claim {tenant.claim}): {why}; until it can, it is not evicted "
                    "for GPU memory (its priority and gang are not known)", labels={RECLAIM_LABEL: "unread"})

    def _replan(self, gpu_uuid: str, snapshot: Snapshot, owed: Sequence[Any],
                facts: Mapping[str, PodFacts]) -> ReclaimPlan | None:
        """A GPU's plan from a fresh reading; None when the owed memory fits now, or NVML cannot be read (the next
        pass decides again)."""
        reading = self._read()
        if reading is None:
            return None
        share = next((s for s in self._shares(reading, snapshot, owed) if s.gpu_uuid == gpu_uuid), None)
        return None if share is None else reclaim.plan(share, facts, self.config.reclaim)

    def _carry_out(self, plan: ReclaimPlan, replan: Callable[[str], ReclaimPlan | None]) -> None:
        if not plan.candidates:
            self._metrics.reclaims.labels(outcome="no-candidate").inc()
            self._short(plan, "no pod uses more than its request there that may be evicted (a pod owed memory, at "
                              "or above the protected priority, or needed by its gang at its minimum is not), so "
                              "nothing can be reclaimed")
            return
        if plan.policy is ReclaimPolicy.OFF:
            for candidate in reclaim.to_evict(plan):
                self._metrics.reclaims.labels(outcome="would-evict").inc()
                self._candidate_event(candidate, plan, "GPUReclaimWouldEvict", "would-evict",
                                      "reclaim.policy is off: would evict this pod")
            return
        last, blocked = self._evict_until_freed(plan, replan)
        if last is not None:
            why = f"evictions refused for {', '.join(blocked)}" if blocked else "the evictions failed"
            self._short(last, f"{why}; the agent tries again after reclaim.gracePeriodSeconds")

    def _evict_until_freed(self, plan: ReclaimPlan, replan: Callable[[str], ReclaimPlan | None],
                           ) -> tuple[ReclaimPlan | None, list[str]]:
        """Evict one victim at a time, as `reclaim.next_victim` picks it from a fresh reading, until the pods going
        free the shortfall: None then, else the last plan (still short), and the pods whose eviction was refused."""
        refused: set[str] = set()
        going = self.evictions.this_pass  # evicted for another GPU or over its limit this pass: once is enough
        blocked: list[str] = []
        current: ReclaimPlan | None = plan
        while current is not None and (victim := reclaim.next_victim(current, refused, going)) is not None:
            # a claim's pods carry no affinity for the back-off label: none is put on for them
            owner = None if victim.pod_uid in self._claim_pods else victim.owner
            outcome, said = self.evictions.evict(victim.namespace, victim.pod, victim.pod_uid, owner)
            if outcome is EvictionOutcome.NOT_KEPT_OFF:
                self._metrics.reclaims.labels(outcome="not-kept-off").inc()
                refused.add(victim.pod_uid)
                self._candidate_event(victim, current, "GPUReclaimNotEvicted", "not-kept-off", "did not evict this pod",
                                      f"; {said}")
            elif outcome is None:
                self._metrics.reclaims.labels(outcome="failed").inc()
                refused.add(victim.pod_uid)
            elif outcome is EvictionOutcome.BLOCKED:
                self._metrics.reclaims.labels(outcome="blocked").inc()
                refused.add(victim.pod_uid)
                blocked.append(f"{victim.namespace}/{victim.pod}")
                self._candidate_event(victim, current, "GPUReclaimBlocked", "blocked", "could not evict this pod",
                                      f"; the eviction was refused ({said}): the next candidate is tried, and this "
                                      "pod again after reclaim.gracePeriodSeconds")
            else:  # evicted, or gone already: either way its memory is being freed (Evictions.this_pass)
                if outcome is EvictionOutcome.EVICTED:
                    self._evicted_for(victim, current)
            current = replan(plan.gpu_uuid)
        if current is None or reclaim.covered(current, going):
            return None, blocked
        return current, blocked

    def _evicted_for(self, candidate: Candidate, plan: ReclaimPlan) -> None:
        self._metrics.reclaims.labels(outcome="evicted").inc()
        self._metrics.reclaimed_bytes.inc(candidate.used_bytes)
        self._candidate_event(candidate, plan, "GPUMemoryReclaimed", "evicted", "evicted this pod")
        self._tell_owed(
            plan, "GPUMemoryReclaimedFor",
            lambda t: f"evicted {candidate.namespace}/{candidate.pod} ({_mib(candidate.used_bytes)} on "
            f"{plan.gpu_uuid}, {_mib(candidate.above_request_bytes)} above its requests) so that this pod's request "
            f"fits: {_mib(t.owed_bytes)} of its {_mib(t.request_bytes)} request not yet used, {_mib(plan.free_bytes)} "
            "free",
            event_type="Normal", labels={RECLAIM_LABEL: "reclaimed-for"},
        )
        if candidate.owner is not None:
            self._owner_event(candidate, plan, self.backoffs.until(candidate.owner),
                              claim=candidate.pod_uid in self._claim_pods)

    def _owner_event(self, candidate: Candidate, plan: ReclaimPlan, until: float | None, *, claim: bool) -> None:
        """Its controller hears it too, and for how long its pods are kept off this node."""
        owner = candidate.owner
        assert owner is not None
        after = (f"its fractional pods are kept off node {self._node} until "
                 f"{dt.datetime.fromtimestamp(until, dt.UTC):%Y-%m-%dT%H:%M:%SZ} (reclaim.backoffSeconds; node label "
                 f"{reclaim_backoff_label(owner.uid)})" if until is not None else
                 "a replacement may be placed on the same GPU again (" +
                 ("its pods take their GPUs through DRA claims, which no back-off label keeps off" if claim else
                  "reclaim.backoffSeconds is 0") + ")")
        message = (f"evicted its pod {candidate.pod} on node {self._node} to reclaim GPU memory on {plan.gpu_uuid} "
                   f"for {_owed_text(plan.owed)}: it used {_mib(candidate.used_bytes)} there, "
                   f"{_mib(candidate.above_request_bytes)} above its requests; {after}")
        try:
            self._kube.create_event(candidate.namespace, owner_event(
                self._node, candidate.namespace, owner, "GPUMemoryReclaimedFromPod", message,
                labels={RECLAIM_LABEL: "owner"}))
        except Exception as err:  # an Event is worth a warning, not a failed pass
            log.warning("recording GPUMemoryReclaimedFromPod on %s %s/%s: %s", owner.kind, candidate.namespace,
                        owner.name, err)

    def _candidate_event(self, candidate: Candidate, plan: ReclaimPlan, reason: str, label: str, what: str,
                         after: str = "") -> None:
        message = (
            f"{what} to reclaim GPU memory on {plan.gpu_uuid} for {_owed_text(plan.owed)}: it uses "
            f"{_mib(candidate.used_bytes)} there, {_mib(candidate.above_request_bytes)} above its requests; "
            f"{_mib(plan.shortfall_bytes + plan.free_bytes)} is owed below requests and {_mib(plan.free_bytes)} "
            f"is free{after}"
        )
        log.warning("%s/%s: %s", candidate.namespace, candidate.pod, message)
        self._event(candidate.namespace, candidate.pod, candidate.pod_uid, reason, message,
                    labels={RECLAIM_LABEL: label})

    def _short(self, plan: ReclaimPlan, why: str) -> None:
        log.warning("GPU %s: requests do not fit (%s short): %s", plan.gpu_uuid, _mib(plan.shortfall_bytes), why)
        self._tell_owed(
            plan, "GPUMemoryGuaranteeShort",
            lambda t: f"this pod's request may not fit on {plan.gpu_uuid}: {_mib(t.owed_bytes)} of its "
            f"{_mib(t.request_bytes)} request not yet used and only {_mib(plan.free_bytes)} free "
            f"({_mib(plan.shortfall_bytes)} short over all requests there): {why}",
            labels={RECLAIM_LABEL: "short"},
        )

    def _tell_owed(self, plan: ReclaimPlan, reason: str, text: Callable[[Tenant], str], **extra: Any) -> None:
        """An Event on each container the plan is for (those below their requests)."""
        for tenant in plan.owed:
            c = tenant.container
            self._event(c.namespace, c.pod, c.pod_uid, reason, text(tenant), container=None if c.claim else c.container,
                        **extra)

    # ---- the Kubernetes edge ----

    def _event(self, namespace: str, pod: str, pod_uid: str, reason: str, message: str, **extra: Any) -> None:
        try:
            self._kube.create_event(namespace, pod_event(self._node, namespace, pod, pod_uid, reason, message,
                                                         **extra))
        except Exception as err:  # an Event is worth a warning, not a failed pass
            log.warning("recording %s on %s/%s: %s", reason, namespace, pod, err)
