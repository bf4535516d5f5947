"""The rule table: every rule of `rules/catalog/`, in the one order a denial lists them (docs/architecture.md,
"Which rule runs where").

Pure. The rules are found, not listed: each module of the catalog holds one `RULE`, and its phase and rank say where
it goes, so adding a rule touches its own module only. tests/webhook/test_rule_table.py fails when a webhook rule is
in no module, and tests/chart/test_policies.py when the chart's policies are not what the table generates.
"""

from __future__ import annotations

import importlib
import pkgutil

from gpufrac.webhook.decide.rules import catalog
from gpufrac.webhook.decide.rules.rule import Phase, Rule


def _rule_of(module_name: str) -> Rule:
    rule = getattr(importlib.import_module(f"{catalog.__name__}.{module_name}"), "RULE", None)
    if not isinstance(rule, Rule):
        raise TypeError(f"{catalog.__name__}.{module_name} holds no RULE: each module of the catalog is one rule")
    return rule


def _ordered(rules: list[Rule]) -> tuple[Rule, ...]:
    phases = list(Phase)
    ordered = tuple(sorted(rules, key=lambda r: (phases.index(r.phase), r.rank)))
    places = [(r.phase, r.rank) for r in ordered]
    if len(set(places)) != len(places):
        raise ValueError("two rules share a phase and rank: give each its own place")
    return ordered


MODULES = tuple(sorted(m.name for m in pkgutil.iter_modules(catalog.__path__)))
RULES: tuple[Rule, ...] = _ordered([_rule_of(m) for m in MODULES])
