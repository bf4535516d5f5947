"""The chart's part of a first day on a real cluster (issue 44): the agent's identity bound to its own node, the
uninstall's host paths, the skew check, the no-NRI default, the MPS pods' tolerate annotation, NOTES for the GPU
Operator 25.10+."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from testkit.chart import CHART, NS, arg_value, container, find, helm, needs_helm, one, render

pytestmark = needs_helm

AGENT_SA = f"system:serviceaccount:{NS}:gpufrac-agent"


def agent_args(objs: list[dict[str, Any]]) -> list[str]:
    args: list[str] = container(one(objs, "DaemonSet", "gpufrac-agent"))["args"]
    return args


def test_the_agent_s_identity_is_bound_to_its_own_node() -> None:
    objs = render()
    policy = one(objs, "ValidatingAdmissionPolicy", "gpufrac-agent-own-node")["spec"]
    resources = {r for rule in policy["matchConstraints"]["resourceRules"] for r in rule["resources"]}
    assert resources == {"nodes", "nodes/status", "resourceslices"}
    assert policy["matchConditions"] == [
        {"name": "the-agent", "expression": f'request.userInfo.username == "{AGENT_SA}"'}]
    own = next(v for v in policy["variables"] if v["name"] == "ownNode")
    assert "authentication.kubernetes.io/node-name" in own["expression"]
    assert one(objs, "ValidatingAdmissionPolicyBinding", "gpufrac-agent-own-node")["spec"]["validationActions"] == [
        "Deny"]
    # evictions: only where the agent may evict, each pod of the namespace a param
    assert not find(objs, "ValidatingAdmissionPolicy", "gpufrac-agent-own-node-evictions")
    evicting = render("--set", "enforcement.overLimitAction=evict")
    binding = one(evicting, "ValidatingAdmissionPolicyBinding", "gpufrac-agent-own-node-evictions")["spec"]
    assert binding["paramRef"] == {"selector": {}, "parameterNotFoundAction": "Deny"}
    assert one(evicting, "ValidatingAdmissionPolicy", "gpufrac-agent-own-node-evictions")["spec"]["paramKind"] == {
        "apiVersion": "v1", "kind": "Pod"}


def test_the_rest_of_the_agent_s_role_is_read_only_or_namespaced() -> None:
    objs = render("--set", "dra.enabled=true", "--set", "enforcement.overLimitAction=evict")
    writes = {(tuple(r.get("apiGroups", [])), r["resources"][0], verb)
              for role in find(objs, "ClusterRole") if role["metadata"]["name"].startswith("gpufrac-agent")
              and not role["metadata"]["name"].endswith("withdraw")
              for r in role["rules"] for verb in r["verbs"] if verb not in ("get", "list", "watch")}
    # every cluster-wide write is one an own-node policy confines (nodes, resourceslices, evictions), or an Event
    assert {resource for _, resource, _ in writes} <= {"nodes", "resourceslices", "pods/eviction", "events"}
    role = one(objs, "Role", "gpufrac-agent")
    assert all(rule["verbs"] == ["get"] and rule.get("resourceNames") for rule in role["rules"])


def test_the_agent_is_told_what_the_uninstall_removes_and_whom_to_compare_versions_with() -> None:
    args = agent_args(render("--set", "dra.enabled=true"))
    assert arg_value(args, "--withdraw-daemonset") == ["gpufrac-agent"]
    assert arg_value(args, "--withdraw-host-path") == [
        "/run/gpufrac/nri", "/run/gpufrac/mps", "/var/lib/gpufrac/dra", "/var/run/cdi/gpu.gpufrac.io-claim_*.json"]
    assert arg_value(args, "--webhook-deployment") == ["gpufrac-webhook"]
    assert "--withdraw-daemonset" not in agent_args(render("--set", "agent.withdrawOnUninstall=false"))


def test_no_nri_is_not_ready_unless_the_env_fallback_is_chosen() -> None:
    assert "--nri-env-fallback" not in agent_args(render())
    assert "--nri-env-fallback" in agent_args(render("--set", "nri.envFallback=true"))


def test_the_mps_pods_start_while_the_nri_plugin_is_away() -> None:
    mps = one(render(), "DaemonSet", "gpufrac-mps")
    assert mps["spec"]["template"]["metadata"]["annotations"]["gpufrac.io/tolerate-missing-nri-plugin"] == "true"


def notes(tmp_path: Path, *args: str) -> str:
    """NOTES.txt as `helm install` prints it (helm template leaves NOTES out: a copy under another name)."""
    copy = tmp_path / "gpufrac"
    shutil.copytree(CHART, copy)
    text = (copy / "templates" / "NOTES.txt").read_text()
    (copy / "templates" / "NOTES.txt").unlink()
    (copy / "templates" / "_notes.tpl").write_text('{{- define "notes" }}' + text + "{{- end }}")
    (copy / "templates" / "notes.yaml").write_text('notes: {{ include "notes" . | toJson }}\n')
    out = helm("template", "gpufrac", str(copy), "--namespace", NS, "--show-only", "templates/notes.yaml", *args)
    rendered: str = yaml.safe_load(out.stdout)["notes"]
    return rendered


def test_notes_tell_a_gpu_operator_cluster_to_set_the_runtime_class(tmp_path: Path) -> None:
    operator = notes(tmp_path / "a", "--api-versions", "nvidia.com/v1/ClusterPolicy")
    assert "this cluster runs NVIDIA's GPU Operator" in operator and "--set agent.runtimeClassName=nvidia" in operator
    elsewhere = notes(tmp_path / "b")
    assert "GPU Operator 25.10 or later" in elsewhere and "this cluster runs" not in elsewhere
    assert "agent.runtimeClassName=nvidia" not in notes(tmp_path / "c", "--set", "agent.runtimeClassName=nvidia")


def test_the_default_mode_reaches_the_webhook_only_when_set() -> None:
    webhook = container(one(render("--set", "webhook.defaultMode=sm-sharing"), "Deployment", "gpufrac-webhook"))
    assert arg_value(webhook["args"], "--default-mode") == ["sm-sharing"]
    assert "--default-mode" not in container(one(render(), "Deployment", "gpufrac-webhook"))["args"]
