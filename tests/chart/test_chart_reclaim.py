"""reclaim.protectedPriority and reclaim.evictGangMembers reach the agent's reclaim settings, and only when set
(tests/chart)."""

from __future__ import annotations

import argparse

import pytest

from gpufrac.agent.decide.reclaim import ReclaimSettings
from gpufrac.agent.programs.node_agent import add_arguments, config_from_args
from testkit.chart import CHART, container, helm, needs_helm, one, render

pytestmark = needs_helm


def reclaim_settings(*values: str) -> ReclaimSettings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    docs = render(*(a for v in values for a in ("--set", v)))
    args = [a.replace("$(NODE_NAME)", "n") for a in container(one(docs, "DaemonSet", "gpufrac-agent"))["args"]]
    return config_from_args(parser.parse_args(args[1:])).guarantee.reclaim


@pytest.mark.parametrize(("values", "protected"), [((), None), (("reclaim.protectedPriority=1000",), 1000),
                                                   (("reclaim.protectedPriority=0",), 0),
                                                   (("reclaim.protectedPriority=-5",), -5)])
def test_protected_priority_reaches_the_agent(values, protected):
    assert reclaim_settings(*values).protected_priority == protected


def test_a_protected_priority_that_is_not_a_number_is_refused():
    failed = helm("template", "g", str(CHART), "--set", "reclaim.protectedPriority=high", check=False)
    assert failed.returncode != 0 and "protectedPriority" in failed.stderr


@pytest.mark.parametrize(("values", "evict", "reads_gangs"), [((), False, True),
                                                              (("reclaim.evictGangMembers=true",), True, False)])
def test_evict_gang_members_reaches_the_agent_and_the_role_reads_podgroups_only_when_needed(values, evict, reads_gangs):
    assert reclaim_settings(*values).evict_gang_members is evict
    role = one(render(*(a for v in values for a in ("--set", v))), "ClusterRole", "gpufrac-agent")
    podgroups = {"apiGroups": ["scheduling.run.ai"], "resources": ["podgroups"], "verbs": ["get"]}
    assert (podgroups in role["rules"]) is reads_gangs


@pytest.mark.parametrize(("values", "grace"), [((), 30), (("reclaim.victimGracePeriodSeconds=5",), 5),
                                               (("reclaim.victimGracePeriodSeconds=null",), None)])
def test_the_victims_grace_period_reaches_the_agent(values, grace):
    """F7: the evicted pod's grace period, a bound on when its memory comes back (null: the pod's own)."""
    assert reclaim_settings(*values).victim_grace_seconds == grace


@pytest.mark.parametrize(("values", "flag"), [
    ((), "--no-keep-off-reclaimed-nodes"),  # reclaim off: no agent writes a back-off label
    (("reclaim.policy=evict",), "--keep-off-reclaimed-nodes"),
    (("reclaim.policy=evict", "reclaim.backoffSeconds=0"), "--no-keep-off-reclaimed-nodes"),
])
def test_the_webhook_adds_the_back_off_affinity_only_where_the_agent_writes_the_label(values, flag):
    """F4: the affinity for the back-off label only with reclaim evicting and a back-off above 0."""
    webhook = container(one(render(*(a for v in values for a in ("--set", v))), "Deployment", "gpufrac-webhook"))
    assert flag in webhook["args"]
