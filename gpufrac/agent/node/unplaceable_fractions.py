"""The agent's watch for fractions no node can place (decide.unplaceable_fractions), run at each tick on a node whose
driver cannot serve time-slicing (no memory limits: before r615), and only there: one list of the fractional pods
no node has; where some of them are time-slicing only because they name no mode, one list of gpufrac's nodes (at most
once a minute while one of them serves time-slicing); then one Warning Event on each such pod, named so that the
agents of every such node make it once; gpufrac_unplaceable_fractions counts the pods told that no node has yet."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from gpufrac.agent.decide.capabilities import has_driver_memory_limits
from gpufrac.agent.decide.events import EventSink
from gpufrac.agent.decide.unplaceable_fractions import (
    NO_NODE_SERVES_TIME_SLICING,
    defaulted_time_slicing,
    drivers,
    unplaceable,
    unplaceable_event,
)
from gpufrac.agent.edges.metrics import AgentMetrics
from gpufrac.agent.node.doors import NodeView
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import enforcement_label
from gpufrac.kube.errors import KubeError

log = logging.getLogger(__name__)

SERVED_READ_EVERY_S = 60.0  # while some node serves time-slicing, how long that answer stands


class PendingFractionsApi(EventSink, Protocol):
    def list_unbound_fractions(self) -> list[dict[str, Any]]: ...

    def labelled_nodes(self, label: str) -> list[dict[str, str]]: ...


class UnplaceableFractionsWatch:
    def __init__(self, kube: PendingFractionsApi, node: str, metrics: AgentMetrics,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._kube, self._node, self._metrics, self._clock = kube, node, metrics, clock
        self._told: set[str] = set()  # the UIDs of the pods whose Event exists
        self._served_seen_at: float | None = None  # when a node serving time-slicing was last listed

    def __call__(self, view: NodeView) -> None:
        inventory = view.inventory
        if (inventory is None or not inventory.gpus or ComputeMode.TIME_SLICING not in view.config.modes
                or has_driver_memory_limits(inventory)):
            return  # this node serves time-slicing, or cannot say why not: the agents that cannot say it
        try:
            self._tell(inventory.driver_version)
        except KubeError as err:  # the API unreachable: the next tick tries again
            log.warning("looking for fractions no node can place: %s", err)
        self._metrics.unplaceable_fractions.set(len(self._told))

    def _tell(self, own_driver: str) -> None:
        pods = self._kube.list_unbound_fractions()
        self._told &= {str((p.get("metadata") or {}).get("uid", "")) for p in pods}
        waiting = [p for p in pods if str((p.get("metadata") or {}).get("uid", "")) not in self._told
                   and defaulted_time_slicing(p) is not None]
        if not waiting or self._served_recently():
            return
        nodes = self._kube.labelled_nodes(enforcement_label(ComputeMode.TIME_SLICING))
        found = unplaceable(waiting, nodes)
        if not found:
            self._served_seen_at = self._clock()
            return
        node_drivers = drivers(nodes, own_driver)
        for pod in found:
            if self._kube.create_event(pod.namespace, unplaceable_event(self._node, pod, node_drivers)):
                log.warning("%s: pod %s/%s names no compute mode and no node serves time-slicing",
                            NO_NODE_SERVES_TIME_SLICING, pod.namespace, pod.name)
            self._told.add(pod.uid)

    def _served_recently(self) -> bool:
        return self._served_seen_at is not None and self._clock() - self._served_seen_at < SERVED_READ_EVERY_S
