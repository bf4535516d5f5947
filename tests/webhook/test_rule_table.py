"""The rule table (gpufrac/webhook/decide/rules/) covers every rule the webhook evaluates: a new rule function
that is in no row fails here, so it either declares its CEL or says why it stays in the webhook."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from gpufrac.webhook.decide import fractions, policies, validation
from gpufrac.webhook.decide.rules import RULES, SETTINGS, VARIABLES, Rule, Scope

ROOT = Path(__file__).resolve().parents[2]
_IDENTIFIER = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")


def _rule_functions() -> set[str]:
    """The functions that judge a pod: the value readers and rules of `fractions`, and every private check and
    public validator of `validation`."""
    out = set()
    readers_and_rules = r"^(rule_|read_(?!containers$|shorthands$|target$|pod_request$))"
    for module, pattern in ((fractions.read, readers_and_rules), (fractions.rules, readers_and_rules),
                            (validation, r"^(_authorship|_webhook_output|_injection|_boundar|_foreign_|_limit_env|"
                                         r"_kai_|validate_status|validate_binding)")):
        for name, obj in inspect.getmembers(module, inspect.isfunction):
            if obj.__module__ == module.__name__ and re.match(pattern, name):
                out.add(f"{module.__name__}.{name}")
    return out


def test_every_rule_function_of_the_webhook_is_in_the_table() -> None:
    covered = {f"{f.__module__}.{f.__name__}" for rule in RULES for f in rule.webhook}
    missing = _rule_functions() - covered
    assert not missing, (f"webhook rules in no row of gpufrac/webhook/decide/rules/: {sorted(missing)}; add a "
                         "Rule with its CEL, or with webhook_only saying why CEL cannot carry it, then run "
                         "`gpufrac policies --format helm > charts/gpufrac/templates/policies/"
                         "validatingadmissionpolicies.yaml`")
    assert len(_rule_functions()) > 20  # the pattern still finds the rules


def test_a_rule_declares_its_cel_or_why_not() -> None:
    with pytest.raises(ValueError, match="give its CEL"):
        Rule("x", "x", Scope.POD, (fractions.read_mode,))
    for rule in RULES:
        assert rule.cel or rule.webhook_only, rule.name


def test_names_are_cel_identifiers_and_unique() -> None:
    names = [r.name for r in RULES] + [n for n, _ in VARIABLES] + list(SETTINGS)
    assert len(names) == len(set(names))
    assert all(_IDENTIFIER.fullmatch(n) for n in names), names


def test_every_variable_a_rule_uses_is_declared() -> None:
    declared = {n for n, _ in VARIABLES} | set(SETTINGS) | {r.name for r in RULES}
    for text in [e for _, e in VARIABLES] + [r.cel or "" for r in RULES]:
        assert set(re.findall(r"variables\.([A-Za-z]\w*)", text)) <= declared


def test_architecture_doc_lists_which_rule_runs_where() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert policies.rule_table_markdown() in doc, ("docs/architecture.md's table is not the rule table's; paste "
                                                   "`gpufrac policies --format docs` into it")
