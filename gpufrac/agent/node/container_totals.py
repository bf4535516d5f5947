"""A container's GPU processes together above its limit (edge): the over-limit action carried out, once per process or
pod (decide.overlimit picks the newest process)."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gpufrac.agent.decide.errors import ProcReadError
from gpufrac.agent.decide.model import EnforcementViolation, EvictionOutcome, ViolationKind
from gpufrac.agent.decide.overlimit import OverLimitAction, newest
from gpufrac.agent.edges.metrics import AgentMetrics
from gpufrac.agent.edges.procfs import read_start_time
from gpufrac.agent.node.evictions import Evictions
from gpufrac.agent.node.pod_events import PodEvents

log = logging.getLogger(__name__)


class ContainerTotals:
    def __init__(self, metrics: AgentMetrics, proc_root: Any, action: OverLimitAction, evictions: Evictions,
                 event: PodEvents, kill: Callable[[int, int], None]) -> None:
        self._metrics = metrics
        self._proc_root = proc_root
        self._action = action
        self.evictions = evictions
        self._event = event
        self._kill = kill
        self._killed: set[tuple[int, int]] = set()  # (pid, start time): a killed process NVML still lists
        self._evicted: set[str] = set()  # pod UIDs evicted for their total

    def hold(self, violations: Sequence[EnforcementViolation]) -> None:
        over = [v for v in violations if v.kind is ViolationKind.MEMORY_OVER_LIMIT]
        self._metrics.containers_over_limit.set(len(over))
        for violation in over:
            if self._action is OverLimitAction.KILL_NEWEST:
                self._kill_newest(violation)
            elif self._action is OverLimitAction.EVICT:
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
