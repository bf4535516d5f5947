"""A fraction that names no compute mode is time-slicing; on a cluster whose GPU nodes all run a driver before r615
(EKS AL2023's 580) no node serves time-slicing, so it is placed nowhere. The agents of those nodes put one Warning
Event on it naming why and the fix (issue 44); none where a node serves time-slicing, or where the pod named a mode.

The pods are the webhook's own output (testkit.admission.created: the real mutation of a KAI shorthand pod)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufrac.agent.decide.capabilities import DRIVER_MAJOR_LABEL
from gpufrac.agent.decide.unplaceable_fractions import (
    NO_NODE_SERVES_TIME_SLICING,
    defaulted_time_slicing,
    drivers,
    unplaceable,
    unplaceable_event,
)
from gpufrac.agent.edges.metrics import AgentMetrics
from gpufrac.agent.node.doors import NodeChecks
from gpufrac.agent.node.unplaceable_fractions import UnplaceableFractionsWatch
from gpufrac.core.annotations import ComputeMode
from gpufrac.webhook.decide.policy import Policy
from testkit.admission import created
from testkit.agent import FakeKube, FakeNode, value
from testkit.pods import pod

TS, SM = "gpufrac.io/enforcement.time-slicing", "gpufrac.io/enforcement.sm-sharing"
OLD_NODE = {TS: "none", SM: "mps", DRIVER_MAJOR_LABEL: "580"}
NEW_NODE = {TS: "driver", SM: "driver", DRIVER_MAJOR_LABEL: "615"}
FIX = ("kai.scheduler/gpu-compute-sharing-mode: sm-sharing", "nvidia.com/container.main.gpu-compute.mode: sm-sharing",
       "webhook.defaultMode=sm-sharing")


def waiting(annotations: dict[str, str] | None = None, *, name: str = "wait", uid: str = "u-wait",
            policy: Policy | None = None) -> dict[str, Any]:
    """A half-GPU pod in KAI's shorthand as the webhook stores it, not bound yet."""
    stored = created(pod({"gpu-fraction": "0.5", **(annotations or {})}, "main", name=name),
                     *(() if policy is None else (policy,)))
    stored["metadata"]["uid"] = uid
    return stored


def test_a_pod_that_names_no_mode_is_unplaceable_where_no_node_serves_time_slicing() -> None:
    found = unplaceable([waiting()], [OLD_NODE, OLD_NODE])
    assert [(f.namespace, f.name, f.uid, f.containers) for f in found] == [("team-a", "wait", "u-wait", ("main",))]
    assert unplaceable([waiting()], [OLD_NODE, NEW_NODE]) == []  # it waits for room there, not for ever
    assert unplaceable([waiting()], [OLD_NODE, {**NEW_NODE, TS: "mps"}]) == []


@pytest.mark.parametrize("case", ["mode named time-slicing", "mode named per container", "webhook default mode",
                                  "bound", "being deleted"])
def test_a_pod_that_named_a_mode_or_has_a_node_is_not(case: str) -> None:
    if case == "mode named time-slicing":
        stored = waiting({"kai.scheduler/gpu-compute-sharing-mode": "time-slicing"})
    elif case == "mode named per container":
        stored = waiting({"nvidia.com/container.main.gpu-compute.mode": "time-slicing"})
    elif case == "webhook default mode":
        stored = waiting(policy=Policy(default_mode=ComputeMode.SM_SHARING))
    else:
        stored = waiting()
        if case == "bound":
            stored["spec"]["nodeName"] = "gpu-node-1"
        else:
            stored["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert defaulted_time_slicing(waiting()) is not None
    assert defaulted_time_slicing(stored) is None
    assert unplaceable([stored], [OLD_NODE]) == []


def test_the_event_names_why_and_the_fix_and_is_the_same_from_every_agent() -> None:
    [found] = unplaceable([waiting()], [OLD_NODE])
    node_drivers = drivers([OLD_NODE, {**OLD_NODE, DRIVER_MAJOR_LABEL: "595"}], "580.95.05")
    assert node_drivers == ["580.95.05", "595"]
    one, other = unplaceable_event("gpu-node-1", found, node_drivers), unplaceable_event("gpu-node-2", found, ["x"])
    assert one["metadata"]["name"] == other["metadata"]["name"]  # several agents create it once
    assert one["metadata"]["name"].startswith("wait.gpufrac-") and one["metadata"]["namespace"] == "team-a"
    assert (one["type"], one["reason"]) == ("Warning", NO_NODE_SERVES_TIME_SLICING)
    assert one["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "team-a", "name": "wait",
                                     "uid": "u-wait"}
    message = one["message"]
    assert len(message) <= 1024 and message.endswith("to r615+")  # not cut
    assert "580.95.05, 595" in message and "r615+" in message and "time-slicing" in message
    assert all(fix in message for fix in FIX), message


@pytest.fixture
def old_cluster(fake_node: FakeNode) -> FakeNode:
    """This node and another run driver 580 (CUDA 13.0): no node serves time-slicing."""
    fake_node.gpus.set(driver_version="580.95.05", cuda_driver_version=13000)
    fake_node.kube.other_nodes["gpu-node-2"] = dict(OLD_NODE)
    return fake_node


def events(kube: FakeKube) -> list[dict[str, Any]]:
    return [e for e in kube.events.values() if e["reason"] == NO_NODE_SERVES_TIME_SLICING]


def ticked(node: FakeNode) -> tuple[FakeKube, AgentMetrics]:
    metrics = AgentMetrics(node=node.config.node)
    agent = node.start_agent(checks=NodeChecks(watches=(UnplaceableFractionsWatch(node.kube, node.config.node,
                                                                                  metrics),)))
    agent.tick()
    return node.kube, metrics


def test_on_a_580_cluster_the_pod_gets_the_event_with_the_fix_once(old_cluster: FakeNode) -> None:
    kube = old_cluster.kube
    kube.pods.append(waiting())
    metrics = AgentMetrics(node=old_cluster.config.node)
    watch = UnplaceableFractionsWatch(kube, old_cluster.config.node, metrics)
    agent = old_cluster.start_agent(checks=NodeChecks(watches=(watch,)))
    agent.tick()  # one agent interval
    [event] = events(kube)
    assert value(metrics, "gpufrac_unplaceable_fractions") == 1
    assert event["involvedObject"]["name"] == "wait" and event["source"]["host"] == "gpu-node-1"
    assert "580" in event["message"] and all(fix in event["message"] for fix in FIX)
    assert kube.labels[TS] == "none"  # this node's own label, listed with the others
    calls = kube.create_event_calls
    agent.tick()
    agent.tick()
    assert kube.create_event_calls == calls and len(events(kube)) == 1  # told: not asked again
    # the agent of the other 580 node finds the same pod: the same Event, AlreadyExists, still one
    UnplaceableFractionsWatch(kube, "gpu-node-2", AgentMetrics(node="gpu-node-2"))(agent)
    assert kube.create_event_calls == calls + 1 and len(events(kube)) == 1
    # the pod bound or gone: forgotten; a new one is told at the next tick
    kube.pods[-1] = waiting(name="next", uid="u-next")
    agent.tick()
    assert sorted(e["involvedObject"]["name"] for e in events(kube)) == ["next", "wait"]
    kube.pods.pop()  # bound elsewhere or deleted
    agent.tick()
    assert value(metrics, "gpufrac_unplaceable_fractions") == 0


def test_no_event_where_some_node_serves_time_slicing(old_cluster: FakeNode) -> None:
    old_cluster.kube.other_nodes["gpu-node-3"] = dict(NEW_NODE)
    old_cluster.kube.pods.append(waiting())
    kube, metrics = ticked(old_cluster)
    assert events(kube) == [] and kube.lists == ["unbound fractions", f"nodes {TS}"]
    assert value(metrics, "gpufrac_unplaceable_fractions") == 0


def test_no_event_where_the_pod_named_a_mode(old_cluster: FakeNode) -> None:
    old_cluster.kube.pods.append(waiting({"kai.scheduler/gpu-compute-sharing-mode": "time-slicing"}))
    kube, _ = ticked(old_cluster)
    assert events(kube) == [] and kube.lists == ["unbound fractions"]  # no node list: nothing to tell


def test_an_r615_node_lists_nothing(fake_node: FakeNode) -> None:
    fake_node.kube.other_nodes["gpu-node-2"] = dict(OLD_NODE)
    fake_node.kube.pods.append(waiting())
    kube, _ = ticked(fake_node)
    assert events(kube) == [] and kube.lists == []  # it serves time-slicing: not its to say, and no cost


def test_a_watch_that_fails_stops_neither_the_other_watches_nor_the_tick(old_cluster: FakeNode,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    def failing(_view: object) -> None:
        raise ConnectionResetError("the API server went away")

    seen: list[object] = []
    agent = old_cluster.start_agent(checks=NodeChecks(watches=(failing, seen.append)))
    agent.ticked.clear()
    agent.tick()
    assert seen == [agent] and agent.ticked.is_set()  # the next watch ran, the tick counted for liveness
    assert "agent watch failing failed" in caplog.text
