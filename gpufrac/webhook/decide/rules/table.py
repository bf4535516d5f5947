"""The rule table: every rule of `rules/catalog/`, in the one order a denial lists them (docs/architecture.md,
"Which rule runs where"), and `run`, which the webhook's phases call instead of naming any rule.

Pure. The rules are found, not listed: each module of the catalog holds one `RULE`, and its phase and rank say where
it goes, so adding a rule touches its own module only. tests/webhook/test_rule_table.py fails when a webhook rule is
in no module, or when a rule added in one module is not run by the webhook or not carried by the policies, and
tests/chart/test_policies.py when the chart's policies are not what the table generates.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from gpufrac.webhook.decide.errors import Violation
from gpufrac.webhook.decide.rules import catalog
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope


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
# Each phase's rules in their order, and those judged fraction by fraction: what `run` walks on every review.
_PHASES = {phase: tuple(r for r in RULES if r.phase is phase) for phase in Phase}
_BY_FRACTION = {phase: [r for r in rules if r.by_fraction] for phase, rules in _PHASES.items()}


def run(phase: Phase, context: object, found: Mapping[Callable[..., Any], Sequence[Violation]] | None = None,
        scopes: Collection[Scope] | None = None,
        by_fraction: Callable[[Any], Iterable[object]] | None = None) -> list[Violation]:
    """Every rule of `phase` (of `scopes`, where given) in its order, each given `context`. A rule found while
    reading (`Rule.reads`) has what its reader `found`, once per reader; the rules judged fraction by fraction
    (`Rule.by_fraction`) are given each context `by_fraction` narrows `context` to, all of them for one fraction
    before the next, where the first of them stands."""
    rules = _PHASES[phase] if scopes is None else [r for r in _PHASES[phase] if r.scope in scopes]
    grouped = _BY_FRACTION[phase] if scopes is None else [r for r in rules if r.by_fraction]
    out: list[Violation] = []
    reported: set[Callable[..., Any]] = set()
    for rule in rules:
        if rule.reads is not None and rule.reads not in reported:
            reported.add(rule.reads)
            out += (found or {}).get(rule.reads, ())
        if rule.by_fraction:
            out += _by_fraction(grouped, context, by_fraction) if rule is grouped[0] else []
        elif rule.check is not None:
            out += rule.check(context)
    return out


def _by_fraction(rules: list[Rule], context: object,
                 narrow: Callable[[Any], Iterable[object]] | None) -> list[Violation]:
    parts = [context] if narrow is None else narrow(context)
    return [v for part in parts for rule in rules if rule.check is not None for v in rule.check(part)]
