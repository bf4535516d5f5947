"""`gpufrac mps-roll`: per node, cordon, wait for (or evict, or list) the fractional pods, replace the MPS pod with
one of the DaemonSet's current revision, uncordon; a node whose clients stay is left as it was and named."""

from __future__ import annotations

import io
import itertools
from typing import Any

import pytest

from gpufrac.agent.programs.mps_roll import Options, active_clients, plan, replacement, roll
from gpufrac.cli import build_parser

NS, DS, NEW, OLD = "gpufrac-system", "gpufrac-mps", "rev-new", "rev-old"
SELECTOR = "app.kubernetes.io/component=mps"


def mps_pod(name: str, node: str, revision: str, *, ready: bool = True, deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": NS,
                                "labels": {"app.kubernetes.io/component": "mps", "controller-revision-hash": revision}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {"metadata": metadata, "spec": {"nodeName": node},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def client(name: str, phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"namespace": "team-a", "name": name}, "status": {"phase": phase}}


class FakeCluster:
    """The DaemonSet controller as mps-roll meets it: a deleted MPS pod comes back on the current revision, Ready
    `polls_to_ready` polls later; fractional pods finish after `polls_to_finish` polls, or when evicted."""

    def __init__(self, pods: list[dict[str, Any]], clients: dict[str, list[dict[str, Any]]] | None = None, *,
                 cordoned: tuple[str, ...] = (), polls_to_ready: int | None = 1, polls_to_finish: int | None = None):
        self.pods = pods
        self.clients = clients or {}
        self.unschedulable = set(cordoned)
        self.polls_to_ready, self.polls_to_finish = polls_to_ready, polls_to_finish
        self.calls: list[tuple[str, ...]] = []
        self.names = (f"gpufrac-mps-new{i}" for i in itertools.count())
        self.pending: list[tuple[str, int]] = []  # node, polls left before its new pod is Ready

    def read_daemonset(self, namespace: str, name: str) -> dict[str, Any] | None:
        if (namespace, name) != (NS, DS):
            return None
        return {"metadata": {"name": name, "uid": "u1"},
                "spec": {"selector": {"matchLabels": {"app.kubernetes.io/component": "mps"}}}}

    def current_revision(self, namespace: str, daemonset: dict[str, Any]) -> str:
        return NEW

    def list_namespaced_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        assert (namespace, label_selector) == (NS, SELECTOR)
        still = []
        for node, left in self.pending:
            if left is not None and left <= 0:
                self.pods.append(mps_pod(next(self.names), node, NEW))
            else:
                still.append((node, None if left is None else left - 1))
        self.pending = still
        return list(self.pods)

    def list_pods(self, node: str) -> tuple[list[dict[str, Any]], str]:
        if self.polls_to_finish is not None:
            if self.polls_to_finish <= 0:
                self.clients[node] = [dict(c, status={"phase": "Succeeded"}) for c in self.clients.get(node, [])]
            self.polls_to_finish -= 1
        return list(self.clients.get(node, [])), "1"

    def list_nodes(self) -> list[dict[str, Any]]:
        nodes = {p["spec"]["nodeName"] for p in self.pods}
        return [{"metadata": {"name": n}, "spec": {"unschedulable": True} if n in self.unschedulable else {}}
                for n in sorted(nodes)]

    def set_unschedulable(self, node: str, unschedulable: bool) -> None:
        self.calls.append(("cordon" if unschedulable else "uncordon", node))
        (self.unschedulable.add if unschedulable else self.unschedulable.discard)(node)

    def delete_pod(self, namespace: str, name: str) -> bool:
        assert not active_clients(self.clients.get(self.node_of(name), [])), "an MPS pod deleted under its clients"
        assert self.node_of(name) in self.unschedulable, "an MPS pod deleted on a schedulable node"
        self.calls.append(("delete", name))
        self.pending.append((self.node_of(name), self.polls_to_ready))
        self.pods = [p for p in self.pods if p["metadata"]["name"] != name]
        return True

    def evict_pod(self, namespace: str, name: str) -> bool:
        self.calls.append(("evict", f"{namespace}/{name}"))
        for pods in self.clients.values():
            for pod in pods:
                if (pod["metadata"]["namespace"], pod["metadata"]["name"]) == (namespace, name):
                    pod["status"] = {"phase": "Failed"}
        return True

    def node_of(self, name: str) -> str:
        (node,) = [p["spec"]["nodeName"] for p in self.pods if p["metadata"]["name"] == name]
        return node


def run(cluster: FakeCluster, **options: Any) -> tuple[list[Any], str]:
    out = io.StringIO()
    outcomes = roll(cluster, Options(NS, DS, poll=0, **options), out)
    return outcomes, out.getvalue()


def test_the_plan_names_each_node_s_mps_pod_and_whether_it_is_current():
    pods = [mps_pod("a", "gpu-2", OLD), mps_pod("b", "gpu-1", NEW), mps_pod("c", "gpu-3", OLD, deleting=True)]
    assert [(p.node, p.pod, p.current) for p in plan(NEW, pods)] == [("gpu-1", "b", True), ("gpu-2", "a", False)]
    assert [p.node for p in plan(NEW, pods, ("gpu-2",))] == ["gpu-2"]
    assert active_clients([client("x"), client("y", "Succeeded"), client("z", "Pending")]) == ("team-a/x", "team-a/z")
    assert replacement([mps_pod("a", "gpu-1", NEW, ready=False)], "gpu-1", "old", NEW) is None
    assert replacement([mps_pod("a", "gpu-1", OLD)], "gpu-1", "old", NEW) is None
    assert replacement([mps_pod("a", "gpu-1", NEW)], "gpu-1", "old", NEW) == "a"


def test_a_node_without_clients_is_cordoned_rolled_and_uncordoned_and_a_current_one_left_alone():
    cluster = FakeCluster([mps_pod("old-1", "gpu-1", OLD), mps_pod("cur-2", "gpu-2", NEW)])
    outcomes, out = run(cluster)
    assert [(o.node, o.result) for o in outcomes] == [("gpu-1", "rolled"), ("gpu-2", "current")]
    assert cluster.calls == [("cordon", "gpu-1"), ("delete", "old-1"), ("uncordon", "gpu-1")]
    assert "node gpu-1: MPS pod old-1 replaced by gpufrac-mps-new0 in" in out
    assert "node gpu-2: MPS pod cur-2 is current" in out
    assert not cluster.unschedulable


def test_running_clients_are_listed_and_the_node_left_as_it_was():
    cluster = FakeCluster([mps_pod("old-1", "gpu-1", OLD)], {"gpu-1": [client("infer"), client("done", "Succeeded")]})
    (outcome,), out = run(cluster)
    assert (outcome.result, outcome.clients, outcome.ok) == ("blocked", ("team-a/infer",), False)
    assert cluster.calls == [("cordon", "gpu-1"), ("uncordon", "gpu-1")]
    assert "MPS pod old-1 kept, fractional pods still running: team-a/infer (wait for them with --wait" in out


def test_clients_that_finish_within_the_wait_let_the_roll_go_on():
    cluster = FakeCluster([mps_pod("old-1", "gpu-1", OLD)], {"gpu-1": [client("job")]}, polls_to_finish=2)
    (outcome,), _ = run(cluster, wait=60)
    assert (outcome.result, outcome.clients) == ("rolled", ("team-a/job",))
    assert cluster.calls == [("cordon", "gpu-1"), ("delete", "old-1"), ("uncordon", "gpu-1")]


def test_evict_evicts_the_clients_before_the_mps_pod_goes():
    cluster = FakeCluster([mps_pod("old-1", "gpu-1", OLD)], {"gpu-1": [client("infer")]})
    (outcome,), _ = run(cluster, evict=True)
    assert outcome.result == "rolled"
    assert cluster.calls == [("cordon", "gpu-1"), ("evict", "team-a/infer"), ("delete", "old-1"), ("uncordon", "gpu-1")]


def test_a_node_cordoned_before_stays_cordoned():
    cluster = FakeCluster([mps_pod("old-1", "gpu-1", OLD)], cordoned=("gpu-1",))
    (outcome,), _ = run(cluster)
    assert outcome.result == "rolled" and cluster.calls == [("delete", "old-1")]
    assert cluster.unschedulable == {"gpu-1"}


def test_dry_run_changes_nothing_and_says_what_it_would_do():
    cluster = FakeCluster([mps_pod("old-1", "gpu-1", OLD)], {"gpu-1": [client("infer")]})
    (outcome,), out = run(cluster, dry_run=True)
    assert outcome.result == "planned" and outcome.ok and cluster.calls == []
    assert out == "node gpu-1: would replace MPS pod old-1; fractional pods: team-a/infer\n"


def test_a_replacement_that_never_gets_ready_is_a_timeout_and_the_node_stays_cordoned():
    cluster = FakeCluster([mps_pod("old-1", "gpu-1", OLD)], polls_to_ready=None)
    clock = itertools.count(0, 50.0)
    out = io.StringIO()
    (outcome,) = roll(cluster, Options(NS, DS, timeout=120, poll=0), out, clock=lambda: next(clock),
                      sleep=lambda _s: None)
    assert outcome.result == "timeout" and not outcome.ok
    assert cluster.unschedulable == {"gpu-1"} and ("uncordon", "gpu-1") not in cluster.calls
    assert "no new one was Ready" in out.getvalue() and "the node stays cordoned" in out.getvalue()


def test_a_missing_daemonset_is_named_and_the_flags_parse():
    with pytest.raises(LookupError, match="no DaemonSet gpufrac-system/other"):
        roll(FakeCluster([]), Options(NS, "other"))
    args = build_parser().parse_args(["mps-roll", "--node", "a", "--node", "b", "--wait", "30", "--dry-run"])
    assert (args.node, args.wait, args.dry_run, args.evict, args.daemonset) == (["a", "b"], 30.0, True, False, DS)
