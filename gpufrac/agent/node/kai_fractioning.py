"""The agent's watch for KAI's gpu-fractioning operator on its node (decide.kai_fractioning): the node's labels,
read at most once a minute; while the operator is there the node condition is False, KAI's readiness conditions
are left to it, and a Warning Event on the Node says why (once per finding)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from gpufrac.agent.decide.events import EventSink
from gpufrac.agent.decide.kai_fractioning import kai_fractioning
from gpufrac.agent.decide.runtime_support import runtime_problem_event

log = logging.getLogger(__name__)

READ_EVERY_S = 60.0


class NodeLabels(Protocol):
    def node_labels(self, node: str) -> dict[str, str]: ...


class KaiFractioningWatch:
    def __init__(self, kube: NodeLabels, events: EventSink, node: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._kube, self._events, self._node, self._clock = kube, events, node, clock
        self._read_at: float | None = None
        self.found: tuple[str, str] | None = None

    def __call__(self) -> tuple[str, str] | None:
        now = self._clock()
        if self._read_at is not None and now - self._read_at < READ_EVERY_S:
            return self.found
        self._read_at = now
        try:
            found = kai_fractioning(self._kube.node_labels(self._node))
        except Exception as err:  # the API unreachable: keep what was found
            log.warning("reading node %s's labels: %s", self._node, err)
            return self.found
        if found is not None and found != self.found:
            log.warning("%s: %s", *found)
            try:
                self._events.create_event("default", runtime_problem_event(self._node, *found))
            except Exception as err:  # an Event is worth a warning, not a lost tick
                log.warning("recording the %s Event: %s", found[0], err)
        self.found = found
        return found

    def standing_down(self) -> bool:
        return self.found is not None
