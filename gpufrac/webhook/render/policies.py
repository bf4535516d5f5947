"""The ValidatingAdmissionPolicies (and their Bindings) generated from the rule table, and the table as docs.

The edge that renders the decisions' rules as objects (the rules, their CEL included, are in
gpufrac/webhook/decide/rules/catalog/, one module each). `gpufrac policies` writes them: as plain YAML for a given
configuration (`--format yaml`), or as the chart's template (`--format helm`, the file
charts/gpufrac/templates/policies/validatingadmissionpolicies.yaml, which a test compares with this output), whose
settings come from the chart's values.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml

from gpufrac.core.contract import Delivery
from gpufrac.webhook.decide.policy import Policy
from gpufrac.webhook.decide.rules import RULES, VARIABLES, Phase, Rule, Scope

CHART_TEMPLATE = "templates/policies/validatingadmissionpolicies.yaml"
NAME_PREFIX = "gpufrac"
API_VERSION = "admissionregistration.k8s.io/v1"


@dataclass(frozen=True)
class PolicyShape:
    """One ValidatingAdmissionPolicy: which requests, and the rules it carries."""

    suffix: str
    operations: tuple[str, ...]
    resources: tuple[str, ...]
    scopes: tuple[Scope, ...]


SHAPES = (
    # `kubectl debug` writes pods/ephemeralcontainers (UPDATE only): the validating webhook judges it as a pod UPDATE.
    PolicyShape("pods", ("CREATE", "UPDATE"), ("pods", "pods/ephemeralcontainers"),
                (Scope.POD, Scope.CREATE, Scope.UPDATE)),
    PolicyShape("pods-status", ("UPDATE",), ("pods/status",), (Scope.STATUS,)),
    PolicyShape("pods-binding", ("CREATE",), ("pods/binding",), (Scope.BINDING,)),
)
# How `validation.validate_pod` composes its answer, which the policies' one validation repeats, phase by phase
# (`rules.Phase`): each rule says its phase and rank in its own module.
DENIALS = "denials"  # the variable holding every message, in the webhook's order


def _settings(policy: Policy) -> dict[str, str]:
    """The CEL of each setting, for one webhook configuration."""
    users, groups = sorted(policy.scheduler_users), sorted(policy.scheduler_groups)
    return {"schedulerUsers": json.dumps(users), "schedulerGroups": json.dumps(groups),
            "allowMultiple": json.dumps(policy.allow_multiple_fraction_containers),
            "mpsRoot": json.dumps(policy.mps_root), "csiDriver": json.dumps(policy.csi_driver),
            "csiDelivery": json.dumps(policy.delivery is Delivery.CSI)}


# The same settings, from the chart's values (one line each of the template).
_HELM_SETTINGS = {
    "schedulerUsers": "{{ .Values.webhook.schedulerUsers | sortAlpha | toJson | quote }}",
    "schedulerGroups": "{{ .Values.webhook.schedulerGroups | sortAlpha | toJson | quote }}",
    "allowMultiple": "{{ .Values.webhook.allowMultipleFractionContainers | toJson | quote }}",
    "mpsRoot": "{{ .Values.mps.root | toJson | quote }}",
    "csiDriver": "{{ .Values.csi.driverName | toJson | quote }}",
    "csiDelivery": "{{ eq .Values.mps.delivery \"csi\" | toJson | quote }}",
}
_SCHEDULER_NAMES = ("size(variables.schedulerUsers) + size(variables.schedulerGroups) == 0 ? "
                    "'no identity (none configured)' : (variables.schedulerUsers + "
                    "variables.schedulerGroups.map(g, 'group ' + g)).join(', ')")


def _used(declared: list[tuple[str, str]], roots: list[str]) -> set[str]:
    """The variables the roots need, directly or through other variables."""
    expressions = dict(declared)
    used = set(roots)
    pending = list(used)
    while pending:
        for name in re.findall(r"variables\.([A-Za-z]\w*)", expressions[pending.pop()]):
            if name not in used:
                used.add(name)
                pending.append(name)
    return used


def rules_of(shape: PolicyShape) -> list[Rule]:
    return [r for r in RULES if r.cel is not None and r.scope in shape.scopes]


def _joined(rules: list[Rule]) -> str:
    return " + ".join(f"variables.{r.name}" for r in rules) or "[]"


def _denials(rules: list[Rule]) -> list[tuple[str, str]]:
    """The variables that gather every rule's messages as the webhook lists them (`validation.validate_pod`): one
    validation then reports them all, where one validation per rule would report only the first that fails."""
    values, authorship, output = ([r for r in rules if r.phase is phase]
                                  for phase in (Phase.VALUE, Phase.AUTHORSHIP, Phase.OUTPUT))
    rest = [r for r in rules if r.phase in (Phase.FRACTIONAL, Phase.OWN)]
    if not values and not authorship and not output:
        return [(DENIALS, _joined(rest))]
    clean = "size(variables.valueDenials) + size(variables.authorshipDenials) == 0"
    after = f"variables.valueDenials + ({clean} ? {_joined(output)} : []) + variables.authorshipDenials"
    if rest:
        after += " + " + _joined(rest)
    return [("valueDenials", _joined(values)), ("authorshipDenials", _joined(authorship)),
            (DENIALS, f"oldObject == null && size(variables.valueDenials) > 0 ? variables.valueDenials : {after}")]


_VALIDATION = {"expression": f"size(variables.{DENIALS}) == 0", "messageExpression": f"variables.{DENIALS}.join('; ')",
               "reason": "Forbidden"}


def _policy(shape: PolicyShape, settings: dict[str, str], meta: dict[str, Any],
            extra: dict[str, Any]) -> dict[str, Any]:
    rules = rules_of(shape)
    declared = [*settings.items(), ("schedulerNames", _SCHEDULER_NAMES), *VARIABLES,
                *((r.name, r.cel or "") for r in rules), *_denials(rules)]
    variables = [{"name": n, "expression": e} for n, e in declared if n in _used(declared, [DENIALS])]
    return {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": meta,
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                **extra.get("matchConstraints", {}),
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": list(shape.operations),
                                   "resources": list(shape.resources), "scope": "Namespaced"}],
            },
            **({"matchConditions": extra["matchConditions"]} if "matchConditions" in extra else {}),
            "variables": variables,
            "validations": [dict(_VALIDATION)],
        },
    }


def _binding(meta: dict[str, Any], actions: list[str] | str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicyBinding", "metadata": meta,
            "spec": {"policyName": meta["name"], "validationActions": actions}}


def policy_objects(policy: Policy, actions: Iterable[str] = ("Deny",),
                   excluded_namespaces: Iterable[str] = ("kube-system",)) -> list[dict[str, Any]]:
    """The policies and bindings for one webhook configuration, ready for `kubectl apply`."""
    extra = {"matchConstraints": {"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": list(excluded_namespaces)}]}}}
    out = []
    for shape in SHAPES:
        meta = {"name": f"{NAME_PREFIX}-{shape.suffix}", "labels": {"app.kubernetes.io/part-of": "gpufrac"}}
        out += [_policy(shape, _settings(policy), meta, extra), _binding(meta, list(actions))]
    return out


def _dump(obj: dict[str, Any]) -> str:
    return yaml.safe_dump(obj, sort_keys=False, width=1 << 16, allow_unicode=True)


def render_yaml(objects: list[dict[str, Any]]) -> str:
    return "---\n".join(_dump(o) for o in objects)


_HEADER = """\
{{- /*
Generated by `gpufrac policies --format helm` from gpufrac/webhook/decide/rules/: do not edit; regenerate
(tests/chart/test_policies.py fails when this file differs from the generator's output).
*/ -}}
{{- if include "gpufrac.policiesEnabled" . }}
"""


# The label gate (webhook.podLabelSelector) on the pod and pod-status policies; a Binding has no labels to match.
BINDING_SHAPE = "pods-binding"
# The pods policy's gates leave the scheduler's UPDATEs to a validating webhook that fails closed (_helpers.tpl).
PODS_SHAPE = "pods"
_OBJECT_SELECTOR = '\n    {{- with include "gpufrac.objectSelector" . }}{{ . | nindent 4 }}{{ end }}'


def render_helm() -> str:
    """The chart's template: every policy and binding, settings and names from the chart's values."""
    placeholder = {n: f"@@{n}@@" for n in _HELM_SETTINGS}
    extra = {"matchConstraints": {"namespaceSelector": "@@namespaceSelector@@"},
             "matchConditions": "@@matchConditions@@"}
    parts = []
    for shape in SHAPES:
        name = f"@@name-{shape.suffix}@@"
        meta = {"name": name, "labels": "@@labels@@"}
        text = _dump(_policy(shape, placeholder, meta, extra)) + "---\n" + _dump(_binding(meta, "@@actions@@"))
        text = text.replace("labels: '@@labels@@'",
                            'labels:\n    {{- include "gpufrac.componentLabels" (list . "webhook") | nindent 4 }}')
        for setting, template in _HELM_SETTINGS.items():
            text = text.replace(f"'@@{setting}@@'", template)
        text = text.replace(f"'{name}'", f'{{{{ include "gpufrac.policyName" (list . "{shape.suffix}") }}}}')
        text = text.replace("'@@actions@@'", "{{ toJson .Values.policies.validationActions }}")
        text = text.replace("namespaceSelector: '@@namespaceSelector@@'",
                            'namespaceSelector:\n      {{- include "gpufrac.namespaceSelector" . | nindent 6 }}'
                            + ("" if shape.suffix == BINDING_SHAPE else _OBJECT_SELECTOR))
        if "CREATE" in shape.operations and "UPDATE" in shape.operations:  # the pods policy
            text = text.replace("      operations:\n      - CREATE\n      - UPDATE\n",
                                '      operations: {{ include "gpufrac.podsPolicyOperations" . }}\n')
        conditions = "gpufrac.podsPolicyMatchConditions\" ." if shape.suffix == PODS_SHAPE \
            else "gpufrac.matchConditions\" (list . false)"
        text = text.replace("matchConditions: '@@matchConditions@@'",
                            f'matchConditions:\n    {{{{- include "{conditions} | nindent 4 }}}}')
        parts.append(text)
    return _HEADER + "---\n" + "---\n".join(parts) + "{{- end }}\n"


def _webhook_side(rule: Rule) -> str:
    """Where the webhook's Python of a rule is: its module's check, or the reader that finds its violations."""
    if rule.check is not None:
        return f"`{rule.check.__module__.rsplit('.', 1)[-1]}.check`"
    return f"`fractions.{getattr(rule.reads, '__name__', '?')}`"


def rule_table_markdown() -> str:
    """docs/architecture.md's table of which rule runs where."""
    lines = ["| rule | requests | webhook | ValidatingAdmissionPolicy | why not (all) in CEL |",
             "|---|---|---|---|---|"]
    for rule in RULES:
        where = _webhook_side(rule)
        policy = f"`{rule.name}`" if rule.cel is not None else "no"
        lines.append(f"| {rule.summary} | {rule.scope.value} | {where} | {policy} | {rule.webhook_only or '—'} |")
    return "\n".join(lines) + "\n"
