"""KAI's gpu-fractioning operator on the node (its mpsd labels the node gpu-fractioning.kai.scheduler/...): the
agent stands down there: gpufrac.io/Ready False with the reason, KAI's readiness conditions left to KAI's operator,
one Warning Event on the Node; once the operator is gone, the agent serves again."""

from __future__ import annotations

from e2e.toolkit.wait import wait_until
from gpufrac.agent.decide.kai_fractioning import KAI_FRACTIONING_PRESENT, kai_fractioning
from gpufrac.agent.node.doors import NodeChecks
from gpufrac.agent.node.kai_fractioning import KaiFractioningWatch
from gpufrac.core.annotations import ComputeMode
from testkit.agent import FakeNode

KAI_LABEL = "gpu-fractioning.kai.scheduler/nvidia-driver-version.major"
KAI_TYPES = ("gpu-sharing.nvidia.com/Ready", "gpu-fractioning.nvidia.com/Ready")


def test_the_operator_is_recognised_by_its_node_label() -> None:
    assert kai_fractioning({"kubernetes.io/hostname": "n"}) is None
    reason, message = kai_fractioning({KAI_LABEL: "580"}) or ("", "")
    assert reason == KAI_FRACTIONING_PRESENT and KAI_LABEL in message and "global.nvFractions.set=false" in message


def test_the_agent_stands_down_where_kai_s_operator_runs(fake_node: FakeNode) -> None:
    now = [0.0]
    watch = KaiFractioningWatch(fake_node.kube, fake_node.kube, fake_node.config.node, clock=lambda: now[0])
    agent = fake_node.start_agent(checks=NodeChecks(blockers=(watch,), standing_down=watch.standing_down))
    agent.tick()
    assert wait_until(lambda: all(s.up for s in agent.daemon_statuses().values()))
    agent.tick()
    assert fake_node.kube.last_condition()["status"] == "True"
    kai_before = {t: fake_node.kube.last_condition(t) for t in KAI_TYPES}
    assert all(c["status"] == "True" for c in kai_before.values())

    fake_node.kube.labels[KAI_LABEL] = "580"  # KAI's mpsd started on the node
    now[0] = 61.0
    calls = len(fake_node.kube.conditions)
    agent.tick()
    own = fake_node.kube.last_condition()
    assert (own["status"], own["reason"]) == ("False", KAI_FRACTIONING_PRESENT)
    assert "gpufrac stands down here" in own["message"]
    written = [c["type"] for c in fake_node.kube.conditions[calls:]]
    assert written == ["gpufrac.io/Ready"], written  # KAI's types left to KAI's operator
    events = [e for e in fake_node.kube.events.values() if e["reason"] == KAI_FRACTIONING_PRESENT]
    assert len(events) == 1 and events[0]["involvedObject"]["kind"] == "Node"
    now[0] = 200.0
    agent.tick()
    assert len([e for e in fake_node.kube.events.values() if e["reason"] == KAI_FRACTIONING_PRESENT]) == 1

    del fake_node.kube.labels[KAI_LABEL]  # the operator removed
    now[0] = 300.0
    agent.tick()
    assert fake_node.kube.last_condition()["status"] == "True"
    assert fake_node.kube.last_condition(KAI_TYPES[1])["status"] == "True"
    assert ComputeMode.SM_SHARING in agent.daemon_statuses()
