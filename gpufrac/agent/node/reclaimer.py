"""Reclaim above request, at the node (edge): memory owed below requests against what is free, decided per GPU
(decide.reclaim, pure) and carried out through the Eviction API, one victim at a time from a fresh reading, with
Events on both sides; where the driver holds each request as a soft limit, only reported."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from gpufrac.agent.decide import reclaim, soft_limits
from gpufrac.agent.decide.attribution import AttributedProcess, attribute
from gpufrac.agent.decide.audit import Snapshot
from gpufrac.agent.decide.errors import ProcReadError
from gpufrac.agent.decide.events import EventSink, owner_event
from gpufrac.agent.decide.model import EvictionOutcome, RunningContainer
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
from gpufrac.agent.edges.procfs import read_cgroup
from gpufrac.agent.node.evictions import Evictions
from gpufrac.agent.node.gang_reader import GangReader
from gpufrac.agent.node.pod_events import PodEvents
from gpufrac.agent.node.usable_memory import UsableMemory
from gpufrac.core.contract import mib_ceil, reclaim_backoff_label
from gpufrac.kube.errors import KubeError

log = logging.getLogger(__name__)

RECLAIM_LABEL = "gpufrac.io/reclaim"  # on reclaim's Events: evicted, reclaimed-for, blocked, would-evict, short


class ReclaimKube(EventSink, Protocol):
    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...


def _mib(value: int) -> str:
    return f"{mib_ceil(max(0, value))} MiB"


def _owed_text(owed: Sequence[Tenant]) -> str:
    return ", ".join(
        f"{t.container.namespace}/{t.container.pod} ({'claim' if t.container.claim else 'container'} "
        f"{t.container.container}: "
        f"{_mib(t.owed_bytes)} of its {_mib(t.request_bytes)} request not yet used)"
        for t in owed
    )


class Reclaimer:
    def __init__(self, kube: ReclaimKube, metrics: AgentMetrics, node: str, proc_root: Any, settings: ReclaimSettings,
                 *, evictions: Evictions, gangs: GangReader, event: PodEvents, usable: UsableMemory,
                 read: Callable[[], UsageReading | None], clock: Callable[[], float],
                 reclaim_by: Callable[[], ReclaimBy]) -> None:
        self._kube = kube
        self._metrics = metrics
        self._node = node
        self._proc_root = proc_root
        self._settings = settings
        self.evictions = evictions
        self.backoffs = evictions.backoffs
        self._gangs = gangs
        self._event = event
        self._usable = usable
        self._read = read
        self._clock = clock
        self._reclaim_by = reclaim_by  # the driver where it holds requests as soft limits: then the agent evicts none
        self._episodes: dict[str, reclaim.Episode] = {}
        self._claim_pods: dict[str, PodFacts | None] = {}  # by UID: the pods claims are for (None: not there)
        self._attributed: list[AttributedProcess] = []  # the last reading's processes of tenants
        self._above: dict[tuple[int, str], soft_limits.AboveRequest] = {}  # driver mode: above request at last pass

    def run(self, reading: UsageReading, snapshot: Snapshot, pods: Sequence[Mapping[str, Any]]) -> dict[str, int]:
        """Decide (pure) on one reading and carry out; returns each GPU's shortfall, for the metric."""
        claim_pods = self._claim_pod_facts(snapshot.claims.tenants)
        # a claim is owed from Prepare on, unless its pod is going; a container the node refuses is owed nothing
        claims = [t for t in snapshot.claims.tenants if not (t.pod_uid in claim_pods and
                                                              claim_pods[t.pod_uid].terminating)]
        owed = admitted([*owed_on_node(pods), *claims], list(snapshot.gpus.values()), self._usable.usable_mib)
        shares = self._shares(reading, snapshot, owed)
        if self._reclaim_by() is ReclaimBy.DRIVER:
            self._episodes = {}  # the driver takes memory above a request back: the agent only reports the shortfall
            self._driver_took(reading, shares)
            return {share.gpu_uuid: share.shortfall_bytes for share in shares}
        self._above = {}
        facts = pod_facts(pods) | claim_pods
        if not self._settings.evict_gang_members:
            facts = self._gangs.with_gangs(facts, shares)
        plans, self._episodes = reclaim.decide(shares, facts, self._episodes, self._clock(), self._settings)
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
                                    self._usable.mps_servers(reading.processes))
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
        return None if share is None else reclaim.plan(share, facts, self._settings)

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
