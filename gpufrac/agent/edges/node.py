"""Publishes the node's labels and Ready conditions, only when they change (plus a heartbeat).

The one readiness is published under gpufrac's own type and under the types other schedulers gate on (KAI's
`gpu-sharing.nvidia.com/Ready` and `gpu-fractioning.nvidia.com/Ready`, its two names across releases, in NvFractions
mode), so they all say the same thing at the same time.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gpufrac.agent.decide.capabilities import CONDITION_TYPE
from gpufrac.agent.decide.model import NodeCondition
from gpufrac.kube.errors import KubeError

log = logging.getLogger(__name__)


class NodeSink(Protocol):
    def patch_node_labels(self, node: str, labels: Mapping[str, str | None]) -> None:
        """None removes the label."""
        ...

    def patch_node_condition(self, node: str, condition: dict[str, Any]) -> None: ...


def condition_body(condition: NodeCondition, now: dt.datetime, transitioned: bool,
                   condition_type: str = CONDITION_TYPE) -> dict[str, Any]:
    stamp = now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "type": condition_type,
        "status": str(condition.status),
        "reason": condition.reason,
        "message": condition.message,
        "lastHeartbeatTime": stamp,
    }
    if transitioned:
        body["lastTransitionTime"] = stamp
    return body


class NodePublisher:
    def __init__(
        self,
        sink: NodeSink,
        node: str,
        *,
        heartbeat: float = 300.0,
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        extra_condition_types: tuple[str, ...] = (),
        removable: Callable[[str], bool] = lambda key: False,
    ) -> None:
        self._sink = sink
        self._removable = removable  # the labels it takes off the node once it no longer publishes them
        self.condition_types = (CONDITION_TYPE, *(t for t in extra_condition_types if t != CONDITION_TYPE))
        self._node = node
        self._heartbeat = heartbeat
        self._now = now
        self._labels: dict[str, str] | None = None
        self._condition: NodeCondition | None = None
        self._condition_at: dt.datetime | None = None
        # True while gpufrac stands down on the node (KAI's gpu-fractioning operator there): only gpufrac.io/Ready
        self.own_condition_only: Callable[[], bool] = lambda: False

    def adopt(self, labels: Mapping[str, str]) -> None:
        """Labels an earlier agent published on the node (read from it): removed unless published again."""
        self._labels = {**{k: v for k, v in labels.items() if self._removable(k)}, **(self._labels or {})}

    def publish(self, labels: dict[str, str], condition: NodeCondition) -> None:
        """Raises KubeError; what failed is retried on the next call."""
        self._publish_labels(labels)
        now = self._now()
        due = self._condition_at is None or (now - self._condition_at).total_seconds() >= self._heartbeat
        if condition != self._condition or due:
            transitioned = self._condition is None or condition.status != self._condition.status
            for condition_type in (CONDITION_TYPE,) if self.own_condition_only() else self.condition_types:
                self._sink.patch_node_condition(
                    self._node, condition_body(condition, now, transitioned, condition_type)
                )
            if condition != self._condition:
                log.info(
                    "node %s %s=%s %s: %s",
                    self._node,
                    ",".join(self.condition_types),
                    condition.status,
                    condition.reason,
                    condition.message,
                )
            self._condition = condition
            self._condition_at = now

    def _publish_labels(self, labels: dict[str, str]) -> None:
        """A label published before (or adopted) and not now is removed where it is `removable`; others stay as last
        published."""
        if labels != self._labels:
            gone: dict[str, str | None] = {key: None for key in self._labels or {}
                                           if key not in labels and self._removable(key)}
            self._sink.patch_node_labels(self._node, {**labels, **gone})
            log.info("node %s labels: %s", self._node, labels)
            self._labels = dict(labels)

    def try_publish_labels(self, labels: dict[str, str]) -> bool:
        """The labels alone, now (between two ticks)."""
        try:
            self._publish_labels(labels)
        except KubeError as err:
            log.warning("labelling node %s: %s", self._node, err)
            return False
        return True

    def try_publish(self, labels: dict[str, str], condition: NodeCondition) -> bool:
        try:
            self.publish(labels, condition)
        except KubeError as err:
            log.warning("publishing node state: %s", err)
            return False
        return True
