"""The agent's check of the skew rule (decide.version_skew): the webhook Deployment's version, read at most once a
minute, against the agent's own; the result is a remark on the node condition and the metric
gpufrac_webhook_version_skew."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from gpufrac.agent.decide.version_skew import webhook_skew
from gpufrac.agent.edges.metrics import AgentMetrics

log = logging.getLogger(__name__)

READ_EVERY_S = 60.0


class DeploymentApi(Protocol):
    def deployment_version(self, namespace: str, name: str) -> str | None: ...


class WebhookSkewWatch:
    def __init__(self, kube: DeploymentApi, namespace: str, deployment: str, own_version: str,
                 metrics: AgentMetrics, clock: Callable[[], float] = time.monotonic) -> None:
        self._kube, self._namespace, self._deployment = kube, namespace, deployment
        self._own, self._metrics, self._clock = own_version, metrics, clock
        self._read_at: float | None = None
        self._found: tuple[str, str] | None = None

    def __call__(self) -> tuple[str, str] | None:
        now = self._clock()
        if self._read_at is None or now - self._read_at >= READ_EVERY_S:
            self._read_at = now
            try:
                webhook = self._kube.deployment_version(self._namespace, self._deployment)
            except Exception as err:  # the API unreachable: keep what was found
                log.warning("reading the webhook's version from %s/%s: %s", self._namespace, self._deployment, err)
                return self._found
            found = webhook_skew(self._own, webhook)
            if found is not None and found != self._found:
                log.warning("%s: %s", *found)
            self._found = found
            self._metrics.webhook_skew.set(1 if found else 0)
        return self._found
