"""The agent's view of its delivery path, each tick: the runtime the NRI plugin registered with and the CDI specs
naming the node's GPUs. Its problems go to the node condition (what it returns), a metric
(gpufrac_node_runtime_problem) and a Warning Event on the Node (once per problem).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpufrac.agent.decide.capabilities import NRI_UNAVAILABLE
from gpufrac.agent.decide.events import EventSink
from gpufrac.agent.decide.model import Inventory
from gpufrac.agent.decide.runtime_support import METRIC_REASONS, runtime_problem_event, runtime_problems
from gpufrac.agent.edges.cdi_specs import CdiSpecs
from gpufrac.agent.edges.metrics import AgentMetrics

log = logging.getLogger(__name__)


class RuntimeWatch:
    """`runtime`: what the NRI plugin registered with ("containerd v2.4.2"; "" before its first registration);
    `nri_problem`: why the plugin hands out nothing (no NRI socket), None while it can."""

    def __init__(self, node: str, cdi: CdiSpecs, runtime: Callable[[], str], nri_problem: Callable[[], str | None],
                 inventory: Callable[[], Inventory | None], metrics: AgentMetrics, events: EventSink) -> None:
        self._node = node
        self._cdi = cdi
        self._runtime = runtime
        self._nri_problem = nri_problem
        self._inventory = inventory
        self._metrics = metrics
        self._events = events
        self._reported: set[tuple[str, str]] = set()

    def __call__(self) -> list[tuple[str, str]]:
        """The node condition's delivery problems now (reason, message). None before the NRI plugin first
        registered (no NRI: the plugin's state is the condition's reason, and CDI specs do not matter) or while NVML
        is down (the condition's reason then)."""
        inventory, runtime = self._inventory(), self._runtime()
        problems = [] if inventory is None or not runtime else runtime_problems(
            runtime, inventory.gpus, self._cdi.names(), tuple(map(str, self._cdi.dirs)))
        nri = self._nri_problem()
        # the condition has NriUnavailable already (the plugin's delivery problem); the metric and Event are here
        reported = problems + ([(NRI_UNAVAILABLE, nri)] if nri else [])
        reasons = {reason for reason, _ in reported}
        for reason in METRIC_REASONS:
            self._metrics.runtime_problem.labels(reason=reason).set(1 if reason in reasons else 0)
        for problem in reported:
            if problem not in self._reported:
                self._report(*problem)
        self._reported = set(reported)
        return problems

    def _report(self, reason: str, message: str) -> None:
        log.warning("%s: %s", reason, message)
        try:
            self._events.create_event("default", runtime_problem_event(self._node, reason, message))
        except Exception as err:  # an Event is worth a warning, not a lost tick
            log.warning("recording the %s Event: %s", reason, err)
