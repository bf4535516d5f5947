"""The chart's ValidatingAdmissionPolicies are what `gpufrac policies` generates from the rule table, and the chart's
`policies.*` values shape them (rendered by the real helm; skipped without it)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from gpufrac.cli import main
from gpufrac.webhook.decide.policy import Policy
from gpufrac.webhook.decide.rules import RULES, Phase
from gpufrac.webhook.render import policies
from testkit.chart import CHART, NS, needs_helm, pod_policies, render, template


def test_the_charts_policies_are_the_generators_output() -> None:
    chart_copy = (CHART / policies.CHART_TEMPLATE).read_text()
    assert chart_copy == policies.render_helm(), (
        f"charts/gpufrac/{policies.CHART_TEMPLATE} differs from the rule table: regenerate it with "
        f"`gpufrac policies --format helm > charts/gpufrac/{policies.CHART_TEMPLATE}`")


def test_the_command_writes_the_chart_template_and_plain_objects(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policies", "--format", "helm"]) == 0
    assert capsys.readouterr().out == policies.render_helm()
    assert main(["policies", "--scheduler-user", "sched", "--action", "Warn", "--action", "Audit"]) == 0
    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = [o["kind"] for o in objects]
    assert kinds == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * len(policies.SHAPES)
    pods = objects[0]
    users = next(v for v in pods["spec"]["variables"] if v["name"] == "schedulerUsers")
    assert json.loads(users["expression"]) == ["sched"]
    assert objects[1]["spec"] == {"policyName": pods["metadata"]["name"], "validationActions": ["Warn", "Audit"]}


def test_each_rule_with_cel_is_one_variable_of_one_policy_whose_one_validation_reports_them_all() -> None:
    objects = policies.policy_objects(Policy())
    vaps = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
    carried = [v["name"] for o in vaps for v in o["spec"]["variables"] if v["name"] in {r.name for r in RULES}]
    assert sorted(carried) == sorted(r.name for r in RULES if r.cel is not None)
    for vap in vaps:
        # One validation: the API server reports only the first failing one, the webhook every rule a pod breaks.
        assert vap["spec"]["validations"] == [{"expression": "size(variables.denials) == 0",
                                               "messageExpression": "variables.denials.join('; ')",
                                               "reason": "Forbidden"}]
    status = next(o for o in objects if o["metadata"]["name"] == "gpufrac-pods-status")
    assert {v["name"] for v in status["spec"]["variables"]} == {"anns", "labels", "status", "denials"}


def test_the_denials_follow_the_webhooks_composition() -> None:
    pods = policies.policy_objects(Policy())[0]
    variables = {v["name"]: v["expression"] for v in pods["spec"]["variables"]}
    values = variables["valueDenials"].split(" + ")
    assert values == [f"variables.{r.name}" for r in RULES if r.cel is not None and r.phase is Phase.VALUE]
    assert "variables.immutable" not in values and "variables.boundaries" not in values
    assert variables["authorshipDenials"] == "variables.devicesOnCreate + variables.immutable"
    denials = variables["denials"]
    # On CREATE the mutating webhook answers first, with the value rules alone.
    assert denials.startswith("oldObject == null && size(variables.valueDenials) > 0 ? variables.valueDenials : ")
    # The webhook's own output only when nothing else is denied; then who may write what, then the rest.
    tail = denials.partition(" : ")[2]
    clean = "(size(variables.valueDenials) + size(variables.authorshipDenials) == 0 ? variables.webhookOutput : [])"
    assert tail.split(" + variables.") == ["variables.valueDenials + " + clean, "authorshipDenials",
                                           "kaiOlderSharingMode", "injection", "boundaries"]


def test_the_pods_policy_judges_kubectl_debug_too() -> None:
    pods = policies.policy_objects(Policy())[0]
    assert pods["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["pods", "pods/ephemeralcontainers"]


def _validating_resources(objs: list[dict[str, Any]]) -> list[str]:
    cfg = next(o for o in objs if o["kind"] == "ValidatingWebhookConfiguration")
    return sorted({resource for rule in cfg["webhooks"][0]["rules"] for resource in rule["resources"]})


@needs_helm
def test_policies_on_by_default_and_the_webhook_leaves_pods_status_to_them() -> None:
    objs = render("--kube-version", "1.36.0", "--set", "webhook.schedulerUsers={b-user,a-user}")
    vaps = pod_policies(objs)
    bindings = pod_policies(objs, "ValidatingAdmissionPolicyBinding")
    assert [o["metadata"]["name"] for o in vaps] == ["gpufrac-pods", "gpufrac-pods-status", "gpufrac-pods-binding"]
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)
    pods = vaps[0]["spec"]
    assert pods["matchConstraints"]["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", NS]
    assert pods["matchConditions"][0]["name"] == "has-fraction-keys"
    users = next(v for v in pods["variables"] if v["name"] == "schedulerUsers")
    assert json.loads(users["expression"]) == ["a-user", "b-user"]  # sorted, as the webhook's message lists them
    assert _validating_resources(objs) == ["pods", "pods/binding", "pods/ephemeralcontainers"]


@needs_helm
def test_policies_off_and_the_webhook_reviews_pods_status_again() -> None:
    objs = render("--set", "policies.enabled=false")
    assert not pod_policies(objs) and not pod_policies(objs, "ValidatingAdmissionPolicyBinding")
    assert _validating_resources(objs) == ["pods", "pods/binding", "pods/ephemeralcontainers", "pods/status"]


@needs_helm
def test_validation_actions_dry_run_and_a_refused_mix() -> None:
    objs = render("--set", "policies.validationActions={Warn,Audit}")
    bindings = pod_policies(objs, "ValidatingAdmissionPolicyBinding")
    assert bindings and all(b["spec"]["validationActions"] == ["Warn", "Audit"] for b in bindings)
    bad = template("--set", "policies.validationActions={Deny,Warn}", check=False)
    assert bad.returncode != 0 and "Deny and Warn cannot be used together" in bad.stderr
    bad = template("--set", "policies.validationActions={Block}", check=False)
    assert bad.returncode != 0 and "validationActions" in bad.stderr


def _validating_conditions(objs: list[dict[str, Any]]) -> list[str]:
    cfg = next(o for o in objs if o["kind"] == "ValidatingWebhookConfiguration")
    return [c["name"] for c in cfg["webhooks"][0]["matchConditions"]]


@needs_helm
def test_the_validating_webhook_skips_create_only_where_the_policies_enforce_everything() -> None:
    """Where the mutating webhook fails open it may not have judged a CREATE: the validating webhook is called on it,
    but for the pods whose every rule the policies enforce."""
    skip = "not-a-create-the-policies-check"
    fail_open = ["--set", "webhook.mutating.failurePolicy=Ignore"]
    assert skip in _validating_conditions(render(*fail_open))
    for values in (["--set", "policies.enabled=false"], ["--set", "policies.validationActions={Warn}"],
                   ["--set", "mps.delivery=hostPath"]):
        assert skip not in _validating_conditions(render(*fail_open, *values)), values
    assert skip not in _validating_conditions(render())  # failing closed, the mutating webhook judges a CREATE
    workloads = next(o for o in render() if o["kind"] == "ValidatingWebhookConfiguration")["webhooks"][1]
    assert skip not in [c["name"] for c in workloads["matchConditions"]]


# Issue 47: the binder's UPDATE judged once. A validating webhook that fails closed judges every rule of the pods
# policy on the scheduler's bind-time UPDATE (and the scheduler's own keys, which the policy leaves to it), and refuses
# it while down; the policy judging it again cost the API server as much as both webhooks (×3.7 of nothing on 1.37.2,
# ×1.9 without the policies). Failing open, the policy still judges it: it is then the only judge during an outage.
SCHEDULER_SKIP = "not-a-scheduler-update-the-webhook-judges"


def _pods_policy_conditions(*values: str) -> dict[str, str]:
    pods = next(o for o in render(*values) if o["kind"] == "ValidatingAdmissionPolicy"
                and o["metadata"]["name"].endswith("-pods"))
    return {c["name"]: c["expression"] for c in pods["spec"]["matchConditions"]}


def _request(operation: str, user: str, groups: list[str] | None = None, sub: str | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {"username": user, **({"groups": groups} if groups is not None else {})}
    return {"operation": operation, "userInfo": info, **({"subResource": sub} if sub else {})}


@needs_helm
def test_failing_closed_the_pods_policy_leaves_the_schedulers_updates_to_the_validating_webhook() -> None:
    from testkit import cel

    expression = _pods_policy_conditions("--set", "webhook.schedulerGroups={kai:binders}")[SCHEDULER_SKIP]

    def judged(request: dict[str, Any]) -> bool:
        return bool(cel.evaluate(expression, request=request))

    assert not judged(_request("UPDATE", "system:serviceaccount:kai-scheduler:binder"))
    assert not judged(_request("UPDATE", "someone", ["kai:binders"]))
    assert judged(_request("UPDATE", "alice", ["system:authenticated"]))  # a user's edit: judged by both
    assert judged(_request("UPDATE", "alice"))  # no groups at all
    assert judged(_request("CREATE", "system:serviceaccount:kai-scheduler:binder"))
    # kubectl debug by the scheduler's identity is not a bind: still judged
    assert judged(_request("UPDATE", "system:serviceaccount:kai-scheduler:binder", sub="ephemeralcontainers"))


@needs_helm
@pytest.mark.parametrize("failing_open", [
    ["--set", "webhook.failurePolicy=Ignore"],
    ["--set", "webhook.validating.failurePolicy=Ignore", "--set", "webhook.mutating.failurePolicy=Ignore"],
    ["--set", "webhook.validating.failurePolicy=Ignore", "--set", "webhook.mutating.reinvocationPolicy=Never"]])
def test_failing_open_the_pods_policy_judges_the_schedulers_updates(failing_open: list[str]) -> None:
    assert SCHEDULER_SKIP not in _pods_policy_conditions(*failing_open)
    assert "has-fraction-keys" in _pods_policy_conditions(*failing_open)


# The binder's UPDATE, one webhook call: the mutating webhook, failing closed and called again after a later mutating
# webhook, judges the scheduler's UPDATEs whole (tests/webhook/test_mutation.py), so the validating one is not called.
MUTATING_JUDGES = "not-a-scheduler-update-the-mutating-webhook-judges"


@needs_helm
def test_failing_closed_the_mutating_webhook_alone_judges_the_schedulers_updates() -> None:
    from testkit import cel

    cfg = next(o for o in render("--set", "webhook.schedulerGroups={kai:binders}")
               if o["kind"] == "ValidatingWebhookConfiguration")
    conditions = {c["name"]: c["expression"] for c in cfg["webhooks"][0]["matchConditions"]}
    assert conditions[MUTATING_JUDGES] == _pods_policy_conditions(
        "--set", "webhook.schedulerGroups={kai:binders}")[SCHEDULER_SKIP]

    def called(request: dict[str, Any]) -> bool:
        return bool(cel.evaluate(conditions[MUTATING_JUDGES], request=request))

    assert not called(_request("UPDATE", "system:serviceaccount:kai-scheduler:binder"))
    assert not called(_request("UPDATE", "someone", ["kai:binders"]))
    assert called(_request("UPDATE", "alice", ["system:authenticated"]))
    assert called(_request("CREATE", "system:serviceaccount:kai-scheduler:binder", sub="binding"))
    assert called(_request("UPDATE", "system:serviceaccount:kai-scheduler:binder", sub="ephemeralcontainers"))
    # the validating webhook failing open changes nothing: the mutating one still judges, and the policy skips them
    assert MUTATING_JUDGES in _validating_conditions(render("--set", "webhook.validating.failurePolicy=Ignore"))
    assert SCHEDULER_SKIP in _pods_policy_conditions("--set", "webhook.validating.failurePolicy=Ignore")
    for mutating_may_miss in (["--set", "webhook.mutating.failurePolicy=Ignore"],
                              ["--set", "webhook.mutating.reinvocationPolicy=Never"]):
        assert MUTATING_JUDGES not in _validating_conditions(render(*mutating_may_miss)), mutating_may_miss
