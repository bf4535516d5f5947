"""Holding the range a fraction promises, at the node (edge): each audit pass ends here, with the guarantee's three
jobs, one module each: the usable memory (usable_memory), container totals (container_totals), reclaim above request
(reclaimer). The decisions are pure (`capacity`, `overlimit`, `reclaim`); those modules read what they need (NVML's
memory, process start times), carry them out (a process killed, a pod evicted through the Eviction API) and report
them (Events, metrics, the usable-memory node labels the agent publishes).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpufrac.agent.decide.audit import Findings, Snapshot
from gpufrac.agent.decide.errors import NvmlError
from gpufrac.agent.decide.events import EventSink
from gpufrac.agent.decide.model import (
    EvictionOutcome,
    Inventory,
)
from gpufrac.agent.decide.overlimit import OverLimitAction
from gpufrac.agent.decide.reclaim import (
    ReclaimPolicy,
    ReclaimSettings,
    UsageReading,
)
from gpufrac.agent.decide.soft_limits import ReclaimBy
from gpufrac.agent.edges.metrics import AgentMetrics
from gpufrac.agent.node.backoffs import Backoffs
from gpufrac.agent.node.container_totals import ContainerTotals
from gpufrac.agent.node.evictions import Evictions
from gpufrac.agent.node.gang_reader import GangReader
from gpufrac.agent.node.pod_events import PodEvents
from gpufrac.agent.node.reclaimer import Reclaimer
from gpufrac.agent.node.usable_memory import UsableMemory

log = logging.getLogger(__name__)



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


class Guarantee:
    """One per agent: its three jobs run once per audit pass, in this order: the usable memory measured, the
    container totals held, reclaim above request."""

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
        self._gpus = gpus
        self._metrics = metrics
        self.config = config
        events = PodEvents(kube, node)
        self.evictions = Evictions(kube, Backoffs(config.reclaim.backoff_seconds, wall_clock, hold_off),
                                   config.reclaim.victim_grace_seconds)
        self.backoffs = self.evictions.backoffs
        self.usable = UsableMemory(proc_root, clock, mps_daemons, config.mps_context_keep_seconds)
        self.totals = ContainerTotals(metrics, proc_root, config.over_limit_action, self.evictions, events, kill)
        self.reclaimer = Reclaimer(kube, metrics, node, proc_root, config.reclaim, evictions=self.evictions,
                                   gangs=GangReader(kube), event=events, usable=self.usable, read=self._read,
                                   clock=clock, reclaim_by=reclaim_by)

    @property
    def labels(self) -> dict[str, str]:
        """The usable-memory labels, published with the agent's others."""
        return self.usable.labels

    @property
    def usable_mib(self) -> dict[str, int]:
        """GPU UUID -> usable memory as of the last pass (what requests may fill)."""
        return self.usable.usable_mib

    def run(self, inventory: Inventory, snapshot: Snapshot, findings: Findings,
            pods: Sequence[Mapping[str, Any]]) -> None:
        self.evictions.new_pass()
        reading = self._read() or UsageReading((), {})
        usable = self.usable.measure(inventory, reading.memory, reading.processes)
        self.totals.hold(findings.violations)
        shortfalls = self.reclaimer.run(reading, snapshot, pods)
        self._metrics.gpu_memory.set(usable, shortfalls)

    def _read(self) -> UsageReading | None:
        try:
            return self._gpus.reading()
        except NvmlError as err:
            log.warning("%s", err)
            return None
