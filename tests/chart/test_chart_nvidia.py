"""The chart beside NVIDIA's node stack: the RuntimeClass of the pods that need the driver (the GPU Operator 25.10+
no longer makes `nvidia` the default runtime), the modes the agent serves, and the alerts for a delivery path that
cannot work. Rendered with the real helm (`make tools`); skipped without it, like the other chart tests."""

from __future__ import annotations

from typing import Any

import pytest

from gpufrac.agent.edges.metrics import AgentMetrics
from gpufrac.cli import build_parser
from gpufrac.core.annotations import ComputeMode
from testkit import REPO_ROOT
from testkit.chart import CHART, container, find, needs_helm, one, render, template

pytestmark = needs_helm

MONITORING = ["--set", "monitoring.prometheusRule.enabled=true",
              "--api-versions", "monitoring.coreos.com/v1/PrometheusRule"]


def driver_pods(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The pod specs of the agent's and the MPS DaemonSets, the pods that need the NVIDIA driver."""
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in find(objs, "DaemonSet")}


def test_no_runtime_class_by_default_and_the_one_named_on_both_driver_pods() -> None:
    default = driver_pods(render())
    assert set(default) == {"gpufrac-agent", "gpufrac-mps"}
    assert all("runtimeClassName" not in spec for spec in default.values())
    named = driver_pods(render("--set", "agent.runtimeClassName=nvidia"))
    assert {name: spec.get("runtimeClassName") for name, spec in named.items()} == {
        "gpufrac-agent": "nvidia", "gpufrac-mps": "nvidia"}
    webhook = one(render("--set", "agent.runtimeClassName=nvidia"), "Deployment")["spec"]["template"]["spec"]
    assert "runtimeClassName" not in webhook  # the webhook needs no driver


def agent_modes(objs: list[dict[str, Any]]) -> tuple[ComputeMode, ...]:
    """The modes the rendered agent serves, as `gpufrac agent` parses its args."""
    agent = container(one(objs, "DaemonSet", "gpufrac-agent"))
    args = build_parser("agent").parse_args(agent["args"])
    modes: tuple[ComputeMode, ...] = args.modes
    return modes


def mps_containers(objs: list[dict[str, Any]]) -> list[str]:
    return [c["name"] for c in one(objs, "DaemonSet", "gpufrac-mps")["spec"]["template"]["spec"]["containers"]]


def test_the_modes_reach_the_agent_and_the_mps_daemonset() -> None:
    default = render()
    assert agent_modes(default) == tuple(ComputeMode)
    assert "--modes" not in container(one(default, "DaemonSet", "gpufrac-agent"))["args"]
    assert mps_containers(default) == ["time-slicing", "sm-sharing"]
    sm_only = render("--set", "agent.modes={sm-sharing}")
    assert agent_modes(sm_only) == (ComputeMode.SM_SHARING,)
    assert mps_containers(sm_only) == ["sm-sharing"]  # no daemon for a mode the agent does not serve


def test_an_unknown_mode_is_refused_by_the_schema() -> None:
    refused = template("--set", "agent.modes={whole-gpu}", check=False)
    assert refused.returncode != 0
    assert "/agent/modes/0" in refused.stderr and "time-slicing" in refused.stderr


def test_the_delivery_alerts_read_the_agents_own_metrics() -> None:
    groups = one(render(*MONITORING), "PrometheusRule")["spec"]["groups"]
    rules = {r["alert"]: r for g in groups for r in g["rules"]}
    problem, nri = rules["GpufracNodeRuntimeProblem"], rules["GpufracNriUnavailable"]
    assert problem["expr"] == ('max by (node, reason) (gpufrac_node_runtime_problem{namespace="gpufrac-system", '
                               'reason!="NriUnavailable"}) > 0')
    assert nri["expr"] == ('max by (node) (gpufrac_node_runtime_problem{namespace="gpufrac-system", '
                           'reason="NriUnavailable"}) > 0')
    # an agent exports every reason's series from its start, with the NRI plugin on or off
    exported = {(s.name, s.labels.get("reason")) for f in AgentMetrics(node="n").registry.collect() for s in f.samples}
    assert {("gpufrac_node_runtime_problem", reason) for reason in
            ("ContainerdTooOld", "NoCdiSpecForGpu", "NriUnavailable")} <= exported
    for rule in (problem, nri):
        assert rule["labels"]["severity"] == "warning" and rule["for"]
    assert "node-check" in problem["annotations"]["description"]
    without_nri = one(render(*MONITORING, "--set", "nri.enabled=false"), "PrometheusRule")["spec"]["groups"]
    assert not {"GpufracNodeRuntimeProblem", "GpufracNriUnavailable"} & {r["alert"] for g in without_nri
                                                                          for r in g["rules"]}


@pytest.mark.parametrize(("path", "words"), [
    (CHART / "values.yaml", ("runtimeClassName", "25.10")),
    (REPO_ROOT / "docs" / "install.md", ("agent.runtimeClassName", "25.10")),
])
def test_the_runtime_class_is_documented(path: Any, words: tuple[str, ...]) -> None:
    text = path.read_text()
    assert all(word in text for word in words)
