"""The label gate (issue 47, webhook.podLabelSelector): opt-in, an objectSelector on the pod webhooks and on the pod
and pod-status policies, so the API server leaves an unlabelled pod before any CEL runs; binds keep a gate of their
own, since a Binding carries no labels. What the gate saves is measured through a real API server in
tests/bench/test_admission_tax_bench.py (no gate evaluated, no webhook called for an unlabelled pod)."""

from __future__ import annotations

from typing import Any

from testkit.chart import needs_helm, one, render

pytestmark = needs_helm

GATE = ["--set", "webhook.podLabelSelector.gpufrac\\.io/fractions=true"]
SELECTOR = {"matchLabels": {"gpufrac.io/fractions": "true"}}


def entries(objs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {w["name"]: w for w in one(objs, kind)["webhooks"]}


def resources(entry: dict[str, Any]) -> set[str]:
    return {r for rule in entry["rules"] for r in rule["resources"]}


def test_off_by_default_no_webhook_or_policy_has_an_object_selector() -> None:
    objs = render()
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for name, entry in entries(objs, kind).items():
            assert "objectSelector" not in entry, name
    assert "validate-bindings.gpufrac.io" not in entries(objs, "ValidatingWebhookConfiguration")
    assert "pods/binding" in resources(entries(objs, "ValidatingWebhookConfiguration")["validate.gpufrac.io"])
    for policy in (o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"):
        assert "objectSelector" not in policy["spec"]["matchConstraints"], policy["metadata"]["name"]


def test_on_the_pod_webhooks_and_pod_policies_select_the_label_and_binds_keep_their_own_entry() -> None:
    objs = render(*GATE)
    assert entries(objs, "MutatingWebhookConfiguration")["mutate.gpufrac.io"]["objectSelector"] == SELECTOR
    validating = entries(objs, "ValidatingWebhookConfiguration")
    assert validating["validate.gpufrac.io"]["objectSelector"] == SELECTOR
    # A Binding has no labels: under the selector no bind would ever be sent, so binds move to an ungated entry.
    assert "pods/binding" not in resources(validating["validate.gpufrac.io"])
    binds = validating["validate-bindings.gpufrac.io"]
    assert "objectSelector" not in binds and resources(binds) == {"pods/binding"}
    # the same gates, less the one on the scheduler's UPDATEs, which a bind never is
    pods = {c["name"]: c["expression"] for c in validating["validate.gpufrac.io"]["matchConditions"]}
    assert [c["name"] for c in binds["matchConditions"]] == [
        n for n in pods if n != "not-a-scheduler-update-the-mutating-webhook-judges"]
    assert binds["matchConditions"][0]["expression"] == pods["has-fraction-keys"]
    assert "objectSelector" not in validating["validate-workloads.gpufrac.io"]  # templates, not pods
    by_resource = {tuple(p["spec"]["matchConstraints"]["resourceRules"][0]["resources"]): p["spec"]["matchConstraints"]
                   for p in objs if p["kind"] == "ValidatingAdmissionPolicy"}
    assert by_resource[("pods", "pods/ephemeralcontainers")]["objectSelector"] == SELECTOR
    assert by_resource[("pods/status",)]["objectSelector"] == SELECTOR
    assert "objectSelector" not in by_resource[("pods/binding",)]


def test_a_label_key_the_api_server_would_refuse_is_refused_by_the_schema() -> None:
    from testkit.chart import template

    bad = template("--set", "webhook.podLabelSelector.bad key=true", check=False)
    assert bad.returncode != 0 and "invalid propertyName 'bad key'" in bad.stderr
