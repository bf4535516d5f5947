"""Events on a pod from the guarantee (edge): an Event is worth a warning, not a failed pass."""

from __future__ import annotations

import logging
from typing import Any

from gpufrac.agent.decide.events import EventSink, pod_event

log = logging.getLogger(__name__)


class PodEvents:
    def __init__(self, kube: EventSink, node: str) -> None:
        self._kube = kube
        self._node = node

    def __call__(self, namespace: str, pod: str, pod_uid: str, reason: str, message: str, **extra: Any) -> None:
        try:
            self._kube.create_event(namespace, pod_event(self._node, namespace, pod, pod_uid, reason, message,
                                                         **extra))
        except Exception as err:  # an Event is worth a warning, not a failed pass
            log.warning("recording %s on %s/%s: %s", reason, namespace, pod, err)
