"""The skew rule between the webhook and the agents (docs/CHANGELOG.md): the agent reads the webhook Deployment's
version once a minute and says a major.minor difference on its node condition and in a metric."""

from __future__ import annotations

from typing import Any

from gpufrac.agent.decide.capabilities import node_condition
from gpufrac.agent.decide.model import ConditionStatus, DaemonState, DaemonStatus, Inventory
from gpufrac.agent.decide.version_skew import WEBHOOK_SKEW, minor_version, webhook_skew
from gpufrac.agent.edges.metrics import AgentMetrics
from gpufrac.agent.node.webhook_skew import WebhookSkewWatch
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import Enforcement
from testkit.agent import UUID_A, gpu_info, value


class Deployments:
    def __init__(self, version: str | None) -> None:
        self.version: str | Exception | None = version
        self.reads = 0

    def deployment_version(self, namespace: str, name: str) -> Any:
        self.reads += 1
        if isinstance(self.version, Exception):
            raise self.version
        return self.version


def test_the_rule_is_the_same_major_minor() -> None:
    assert minor_version("0.2.0") == (0, 2) and minor_version("v1.10.3-rc1") == (1, 10) and minor_version("dev") is None
    assert webhook_skew("0.2.0", "0.2.7") is None  # patches may differ
    assert webhook_skew("0.2.0", None) is None  # no webhook in the release, or not readable
    reason, message = webhook_skew("0.2.0", "0.1.0") or ("", "")
    assert reason == WEBHOOK_SKEW and "webhook runs gpufrac 0.1.0 and this agent 0.2.0" in message
    assert webhook_skew("1.2.0", "0.2.0") is not None


def test_the_agent_reads_once_a_minute_and_reports_on_the_condition_and_the_metric() -> None:
    now = [0.0]
    api = Deployments("0.1.0")
    metrics = AgentMetrics(node="gpu-1")
    watch = WebhookSkewWatch(api, "gpufrac-system", "gpufrac-webhook", "0.2.0", metrics, clock=lambda: now[0])
    found = watch()
    assert found is not None and found[0] == WEBHOOK_SKEW and value(metrics, "gpufrac_webhook_version_skew") == 1
    now[0] = 30.0
    api.version = "0.2.1"
    assert watch() == found and api.reads == 1  # not read again within the minute
    now[0] = 61.0
    assert watch() is None and value(metrics, "gpufrac_webhook_version_skew") == 0
    now[0] = 130.0
    api.version = RuntimeError("connection refused")
    assert watch() is None  # the last reading stays


def test_a_skew_is_the_reason_of_a_ready_condition_where_nothing_else_is_said() -> None:
    inventory = Inventory("615.10", 13040, (gpu_info(0, UUID_A),))
    modes = tuple(ComputeMode)
    enforced = dict.fromkeys(ComputeMode, Enforcement.DRIVER)
    daemons = {mode: DaemonStatus(mode, DaemonState.RUNNING, True, 0) for mode in ComputeMode}
    skew = webhook_skew("0.2.0", "0.1.0")
    assert skew is not None
    condition = node_condition(inventory, modes, enforced, daemons, remarks=[skew])
    assert (condition.status, condition.reason) == (ConditionStatus.TRUE, WEBHOOK_SKEW)
    assert skew[1] in condition.message
    blocked = node_condition(inventory, modes, enforced, daemons, blocking=[("KaiFractioningPresent", "stand down")])
    assert (blocked.status, blocked.reason, blocked.message) == (ConditionStatus.FALSE, "KaiFractioningPresent",
                                                                 "stand down")
