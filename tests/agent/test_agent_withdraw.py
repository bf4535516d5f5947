"""`gpufrac agent-withdraw` (the chart's pre-delete hook): the agents stop first, then their labels and conditions
come off every node that has them, then the MPS daemons stop; nothing else on a node is touched."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpufrac.agent.decide import hard_limits
from gpufrac.agent.decide.capabilities import CONDITION_TYPE, node_labels, ready_condition_types
from gpufrac.agent.decide.model import Inventory
from gpufrac.agent.programs import withdraw as withdraw_module
from gpufrac.agent.programs.withdraw import (
    AGENT_LABELS,
    ReleaseDaemonSet,
    WithdrawalPlan,
    condition_types,
    leftover,
    withdraw,
)
from gpufrac.cli import build_parser
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import Enforcement
from gpufrac.kube.errors import UnreachableError
from testkit.agent import UUID_A, UUID_B, gpu_info

KAI_CONDITION_TYPE, KAI_FRACTIONING_TYPE = "gpu-sharing.nvidia.com/Ready", "gpu-fractioning.nvidia.com/Ready"
AGENTS = ReleaseDaemonSet("gpufrac-agent", "app.kubernetes.io/component=agent")
MPS = ReleaseDaemonSet("gpufrac-mps", "app.kubernetes.io/component=mps")
KUBELET_LABELS = {"kubernetes.io/hostname": "gpu-1", "nvidia.com/gpu.present": "true"}


def node(name: str, labels: dict[str, str], conditions: tuple[str, ...]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": dict(labels)},
            "status": {"conditions": [{"type": t, "status": "True"} for t in conditions]}}


class FakeApi:
    """The cluster as the hook sees it: DaemonSets whose pods go a few polls after the delete, and nodes."""

    def __init__(self, nodes: list[dict[str, Any]], *, polls_to_go: dict[str, int | None] | None = None) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.daemonsets = {AGENTS.name: AGENTS.selector, MPS.name: MPS.selector}
        self.pods = {AGENTS.selector: 2, MPS.selector: 2}
        self.polls_to_go = polls_to_go or {}  # None: never (a node that is down)
        self.calls: list[tuple[str, ...]] = []

    def delete_daemonset(self, namespace: str, name: str) -> bool:
        self.calls.append(("delete", namespace, name))
        return self.daemonsets.pop(name, None) is not None

    def count_pods(self, namespace: str, label_selector: str) -> int:
        deleted = label_selector not in self.daemonsets.values()
        polls = self.polls_to_go.get(label_selector, 1)
        if deleted and polls is not None:
            self.polls_to_go[label_selector] = polls - 1
            if polls <= 0:
                self.pods[label_selector] = 0
        return self.pods[label_selector]

    def list_nodes(self) -> list[dict[str, Any]]:
        return json.loads(json.dumps(list(self.nodes.values())))

    def remove_node_labels(self, name: str, keys: tuple[str, ...]) -> None:
        assert self.pods[AGENTS.selector] == 0 or self.polls_to_go.get(AGENTS.selector, 0) is None, \
            "labels removed while an agent could still publish them again"
        self.calls.append(("labels", name, *keys))
        for key in keys:
            self.nodes[name]["metadata"]["labels"].pop(key)

    def delete_secret(self, namespace: str, name: str) -> bool:
        assert self.pods[MPS.selector] == 0, "the CA Secret deleted before the MPS daemons stopped"
        self.calls.append(("secret", namespace, name))
        return True

    def remove_node_conditions(self, name: str, types: tuple[str, ...]) -> None:
        self.calls.append(("conditions", name, *types))
        status = self.nodes[name]["status"]
        status["conditions"] = [c for c in status["conditions"] if c["type"] not in types]

    def remove_node_annotations(self, name: str, keys: tuple[str, ...]) -> None:
        self.calls.append(("annotations", name, *keys))
        for key in keys:
            self.nodes[name]["metadata"]["annotations"].pop(key)

    def labels(self, name: str) -> dict[str, str]:
        return self.nodes[name]["metadata"]["labels"]

    def condition_types(self, name: str) -> set[str]:
        return {c["type"] for c in self.nodes[name]["status"]["conditions"]}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def published() -> dict[str, str]:
    """What an agent publishes on a node with two GPUs on a driver with memory limits."""
    inventory = Inventory("615.10", 13040, (gpu_info(0, UUID_A), gpu_info(1, UUID_B)))
    return {**node_labels(inventory, dict.fromkeys(ComputeMode, Enforcement.DRIVER)),
            **hard_limits.labels(dict.fromkeys(ComputeMode, hard_limits.Boundary.HARD))}  # issue 43's boundaries


def run(api: FakeApi, plan: WithdrawalPlan) -> tuple[withdraw_module.WithdrawalOutcome, Clock]:
    clock = Clock()
    return withdraw(api, plan, clock=clock, sleep=clock.sleep), clock


def test_every_label_the_agent_publishes_is_withdrawn() -> None:
    assert set(published()) == set(AGENT_LABELS)


def test_the_mps_daemons_stop_first_then_the_agents_then_their_labels_and_conditions_go() -> None:
    api = FakeApi([
        node("gpu-1", KUBELET_LABELS | published(),
             ("Ready", CONDITION_TYPE, KAI_CONDITION_TYPE, KAI_FRACTIONING_TYPE)),
        node("cpu-1", {"kubernetes.io/hostname": "cpu-1"}, ("Ready",)),
    ])
    types = condition_types(ready_condition_types(None))  # the default: both of KAI's names
    outcome, clock = run(api, WithdrawalPlan("gpufrac-system", AGENTS, MPS, types, 60, 1))
    assert outcome.nodes == ["gpu-1"]
    assert api.calls == [
        ("delete", "gpufrac-system", "gpufrac-mps"),
        ("delete", "gpufrac-system", "gpufrac-agent"),
        ("labels", "gpu-1", *AGENT_LABELS),
        ("conditions", "gpu-1", CONDITION_TYPE, KAI_CONDITION_TYPE, KAI_FRACTIONING_TYPE),
    ]
    assert api.labels("gpu-1") == KUBELET_LABELS and api.condition_types("gpu-1") == {"Ready"}
    assert api.labels("cpu-1") == {"kubernetes.io/hostname": "cpu-1"} and api.condition_types("cpu-1") == {"Ready"}
    assert api.pods == {AGENTS.selector: 0, MPS.selector: 0}  # the MPS daemons were waited for too
    assert outcome.agents_stopped_s == 1 and outcome.mps_stopped_s == 1 and outcome.total_s == clock.now == 2


def test_only_the_configured_condition_types_are_removed() -> None:
    other = "gpu-fractioning.nvidia.com/Ready"
    api = FakeApi([node("gpu-1", published(), (CONDITION_TYPE, KAI_CONDITION_TYPE, other))])
    run(api, WithdrawalPlan("ns", AGENTS, None, condition_types((other,))))
    assert api.condition_types("gpu-1") == {KAI_CONDITION_TYPE}  # published by someone else on this cluster
    api = FakeApi([node("gpu-1", published(), (CONDITION_TYPE, KAI_CONDITION_TYPE))])
    run(api, WithdrawalPlan("ns", AGENTS, None, condition_types(())))
    assert api.condition_types("gpu-1") == {KAI_CONDITION_TYPE}


def test_a_node_with_only_a_condition_left_loses_it_and_untouched_nodes_get_no_patch() -> None:
    api = FakeApi([node("gpu-1", {}, (CONDITION_TYPE,)), node("gpu-2", {}, ("Ready",))])
    outcome, _ = run(api, WithdrawalPlan("ns", AGENTS, None, condition_types(())))
    assert outcome.nodes == ["gpu-1"]
    assert [c for c in api.calls if c[0] != "delete"] == [("conditions", "gpu-1", CONDITION_TYPE)]


def test_the_ca_secret_goes_last_and_only_when_named() -> None:
    api = FakeApi([node("gpu-1", published(), (CONDITION_TYPE,))], polls_to_go={AGENTS.selector: 0, MPS.selector: 0})
    run(api, WithdrawalPlan("ns", AGENTS, MPS, secret="gpufrac-webhook-tls"))
    assert api.calls[-1] == ("secret", "ns", "gpufrac-webhook-tls")
    kept = FakeApi([node("gpu-1", published(), (CONDITION_TYPE,))])
    run(kept, WithdrawalPlan("ns", AGENTS, MPS))
    assert not [c for c in kept.calls if c[0] == "secret"]
    plan = withdraw_module.plan_from_args(parse(*REQUIRED, "--delete-secret", "gpufrac-webhook-tls"))
    assert plan.secret == "gpufrac-webhook-tls"


def test_without_an_mps_daemonset_only_the_agents_are_stopped() -> None:
    api = FakeApi([node("gpu-1", published(), (CONDITION_TYPE,))])
    outcome, _ = run(api, WithdrawalPlan("ns", AGENTS))
    assert [c for c in api.calls if c[0] == "delete"] == [("delete", "ns", "gpufrac-agent")]
    assert outcome.mps_stopped_s is None and api.pods[MPS.selector] == 2


def test_agents_that_outlive_the_timeout_are_logged_and_the_rest_is_done(caplog: pytest.LogCaptureFixture) -> None:
    api = FakeApi([node("gpu-1", published(), (CONDITION_TYPE,))], polls_to_go={AGENTS.selector: None})
    outcome, clock = run(api, WithdrawalPlan("ns", AGENTS, MPS, timeout=30, poll=2))
    assert outcome.agents_stopped_s is None and 30 <= clock.now < 40
    assert api.labels("gpu-1") == {} and api.condition_types("gpu-1") == set()
    assert outcome.mps_stopped_s is not None
    assert "2 pod(s) of gpufrac-agent still there after 30 s" in caplog.text


def test_a_second_run_finds_nothing_left_and_patches_nothing() -> None:
    api = FakeApi([node("gpu-1", published(), (CONDITION_TYPE, KAI_CONDITION_TYPE))])
    plan = WithdrawalPlan("ns", AGENTS, MPS, condition_types((KAI_CONDITION_TYPE,)))
    run(api, plan)
    api.calls.clear()
    outcome, _ = run(api, plan)  # the hook's Job restarted after a failure, or run by hand after --no-hooks
    assert outcome.nodes == [] and [c[0] for c in api.calls] == ["delete", "delete"]


def test_the_usable_memory_labels_of_every_gpu_model_are_withdrawn() -> None:
    usable = {"gpufrac.io/gpu-memory-usable-mib.NVIDIA-H200": "139000",
              "gpufrac.io/gpu-memory-usable-mib.NVIDIA-L4": "22000"}
    found = leftover(node("n", KUBELET_LABELS | published() | usable, ()), (CONDITION_TYPE,))
    assert found is not None and found.labels == (*AGENT_LABELS, *sorted(usable))


def test_leftover_reads_a_node_without_labels_or_status() -> None:
    assert leftover({"metadata": {"name": "bare"}}, (CONDITION_TYPE,)) is None
    found = leftover(node("n", {"gpufrac.io/gpu-count": "1", "gpufrac.io/fractional": "x"}, ()), (CONDITION_TYPE,))
    assert found is not None and found.labels == ("gpufrac.io/gpu-count", "gpufrac.io/fractional")
    assert found.condition_types == ()


def test_every_gpufrac_label_annotation_and_condition_goes_reclaim_s_back_offs_and_the_front_door_too() -> None:
    extra = {"gpufrac.io/reclaimed.0123456789abcdef": "1765000000", "gpufrac.io/front-door": "dra"}
    gpu = node("gpu-1", KUBELET_LABELS | published() | extra, ("Ready", CONDITION_TYPE, "gpufrac.io/Other"))
    gpu["metadata"]["annotations"] = {"gpufrac.io/note": "x", "other.io/keep": "y"}
    api = FakeApi([gpu])
    run(api, WithdrawalPlan("ns", AGENTS, MPS))
    assert api.labels("gpu-1") == KUBELET_LABELS
    assert api.nodes["gpu-1"]["metadata"]["annotations"] == {"other.io/keep": "y"}
    assert api.condition_types("gpu-1") == {"Ready"}


def test_condition_types_keep_gpufrac_ready_first_and_once() -> None:
    assert condition_types((KAI_CONDITION_TYPE, CONDITION_TYPE)) == (CONDITION_TYPE, KAI_CONDITION_TYPE)


# ---- the command ----


def parse(*argv: str) -> Any:
    return build_parser("agent-withdraw").parse_args(["agent-withdraw", *argv])


REQUIRED = ("--namespace", "gpufrac-system", "--agent-daemonset", AGENTS.name, "--agent-selector", AGENTS.selector)


def test_the_flags_follow_the_agents_condition_types() -> None:
    assert withdraw_module.plan_from_args(parse(*REQUIRED)).condition_types == (CONDITION_TYPE, KAI_CONDITION_TYPE,
                                                                                KAI_FRACTIONING_TYPE)
    plan = withdraw_module.plan_from_args(parse(*REQUIRED, "--ready-condition-type", "", "--mps-daemonset", MPS.name,
                                                "--mps-selector", MPS.selector))
    assert plan.condition_types == (CONDITION_TYPE,) and plan.mps == MPS


def test_the_command_logs_one_json_summary(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    api = FakeApi([node("gpu-1", published(), (CONDITION_TYPE, KAI_CONDITION_TYPE))], polls_to_go={
        AGENTS.selector: 0, MPS.selector: 0})
    monkeypatch.setattr("gpufrac.agent.edges.kube.KubeClient.from_config", classmethod(lambda cls, path: api))
    args = parse(*REQUIRED, "--mps-daemonset", MPS.name, "--mps-selector", MPS.selector)
    assert args.func(args) == 0
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert {"time", "level", "logger", "message"} <= set(lines[-1])
    summary = lines[-1]
    assert summary["logger"] == "gpufrac.agent.programs.withdraw" and summary["nodes"] == ["gpu-1"]
    # Seconds each stop took: no pods to wait for, so no poll, but a loaded machine still spends a few ms.
    assert all(isinstance(summary[k], (int, float)) and 0 <= summary[k] < 1
               for k in ("agents_stopped_s", "mps_stopped_s"))
    assert api.labels("gpu-1") == {}


def test_an_api_failure_is_one_error_line_and_exit_1(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    class Down(FakeApi):
        def delete_daemonset(self, namespace: str, name: str) -> bool:
            raise UnreachableError(f"deleting daemonset {namespace}/{name}: connection refused")

    monkeypatch.setattr("gpufrac.agent.edges.kube.KubeClient.from_config", classmethod(lambda cls, path: Down([])))
    args = parse(*REQUIRED)
    assert args.func(args) == 1
    [line] = capsys.readouterr().err.splitlines()
    entry = json.loads(line)
    assert entry["level"] == "error" and "connection refused" in entry["message"] and "exception" not in entry


def test_an_mps_daemonset_without_its_selector_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(*REQUIRED, "--mps-daemonset", MPS.name)
    assert args.func(args) == 2
    assert "--mps-selector" in capsys.readouterr().err
