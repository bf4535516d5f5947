"""One audit pass of the node loop: observe (NVML's processes, the pods, /proc of the processes), decide (pure:
decide/audit.py), act (metrics, an Event per violation, evictions when asked), then hold the guarantee."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from gpufrac.agent.decide.attribution import in_fractional_container
from gpufrac.agent.decide.audit import Findings, Snapshot, decide
from gpufrac.agent.decide.claim_tenants import ClaimTenants
from gpufrac.agent.decide.errors import NvmlError, ProcReadError
from gpufrac.agent.decide.events import EventSink, ViolationRecorder
from gpufrac.agent.decide.model import EnforcementViolation, GpuMemory, GpuProcess, Inventory, ViolationKind
from gpufrac.agent.decide.pods import index_by_container_id
from gpufrac.agent.edges.metrics import AgentMetrics
from gpufrac.agent.edges.podwatch import PodCache
from gpufrac.agent.edges.procfs import read_cgroup, read_environ
from gpufrac.agent.node.agent_config import AgentConfig
from gpufrac.agent.node.guarantee import Guarantee, GuaranteeKube, MemorySource

log = logging.getLogger(__name__)

# Evicting does not fix a placement the scheduler made; the other kinds are the pod's own.
EVICTABLE = frozenset(ViolationKind) - {ViolationKind.MIXED_MODES}


class GpuSource(MemorySource, Protocol):
    def inventory(self) -> Inventory: ...

    def processes(self) -> list[GpuProcess]: ...

    def memory(self) -> dict[str, GpuMemory]: ...


class AuditKube(GuaranteeKube, EventSink, Protocol):
    def evict_pod(self, namespace: str, name: str) -> bool: ...


class AuditPass:
    def __init__(self, config: AgentConfig, kube: AuditKube, gpus: GpuSource, metrics: AgentMetrics, pods: PodCache,
                 guarantee: Guarantee, claims: Callable[[], ClaimTenants] = ClaimTenants,
                 held_by: Callable[[], Mapping[tuple[str, str], str]] = dict) -> None:
        self._config = config
        self._held_by = held_by  # what holds each fraction's memory (node.hard_limits), for the report
        self._claims = claims  # the DRA driver's prepared shares, audited like annotated fractions
        self._kube = kube
        self._gpus = gpus
        self._metrics = metrics
        self._pods = pods
        self._recorder = ViolationRecorder(kube, config.node)
        self.guarantee = guarantee
        self._evicted: set[str] = set()
        self.violations: list[EnforcementViolation] = []

    def run(self, inventory: Inventory) -> None:
        observed = self._observe(inventory)
        if observed is None:
            self._metrics.set_usage(())  # the processes are not known: no stale series
            return
        snapshot, pods = observed
        findings = decide(snapshot)
        self._act(findings, {p["metadata"]["uid"] for p in pods} | snapshot.claims.pod_uids)
        self.guarantee.run(inventory, snapshot, findings, pods)

    def _observe(self, inventory: Inventory) -> tuple[Snapshot, list[dict[str, Any]]] | None:
        """What the audit reads: NVML's processes, the pods, and /proc of the processes. None: NVML failed."""
        try:
            processes = self._gpus.processes()
        except NvmlError as err:
            log.warning("%s", err)
            return None
        pods = self._pods.snapshot()
        claims = self._claims()
        index = index_by_container_id(pods)
        self._metrics.unreadable_canonical.set(index.unreadable)
        cgroups: dict[int, str] = {}
        environs: dict[int, dict[str, str]] = {}
        for process in processes:
            try:
                cgroups[process.pid] = read_cgroup(self._config.proc_root, process.pid)
                if in_fractional_container(cgroups[process.pid], index.by_id, claims):
                    environs[process.pid] = read_environ(self._config.proc_root, process.pid)
            except ProcReadError as err:  # it exited meanwhile: what was read still counts
                log.debug("%s", err)
        return Snapshot(processes, index.by_id, cgroups, environs, inventory.by_uuid(), claims,
                        self._held_by()), pods

    def _act(self, findings: Findings, live_pod_uids: set[str]) -> None:
        """Publish what the audit found: metrics, events (once per violation), evictions when asked."""
        self.violations = findings.violations
        self._metrics.set_usage(findings.usage)
        try:
            new = self._recorder.record(self.violations)
        except Exception as err:
            log.warning("recording violations: %s", err)
            new = []
        for violation in new:
            log.warning("violation %s: %s/%s: %s", violation.kind, violation.container.namespace,
                        violation.container.pod, violation.message)
            self._metrics.violations.labels(kind=str(violation.kind)).inc()
        if self._config.evict_on_violation:
            self._evict(self.violations)
        self._recorder.forget_pods(live_pod_uids)

    def _evict(self, violations: Sequence[EnforcementViolation]) -> None:
        for violation in violations:
            c = violation.container
            if violation.kind not in EVICTABLE or c.pod_uid in self._evicted:
                continue
            try:
                if self._kube.evict_pod(c.namespace, c.pod):
                    log.warning("evicted %s/%s: %s", c.namespace, c.pod, violation.kind)
                    self._evicted.add(c.pod_uid)
            except Exception as err:
                log.warning("evicting %s/%s: %s", c.namespace, c.pod, err)
