"""The rule `portionWithoutMemory`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import Field
from gpufrac.webhook.decide.cel import has_ann, lit, when
from gpufrac.webhook.decide.errors import Violation, annotation
from gpufrac.webhook.decide.rules.context import Values
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    LIM,
    REQ,
)
from gpufrac.webhook.decide.rules.variables import (
    per_key,
)

PROBLEM = (f"cannot be used together with {ann.FRACTION}: the scheduler writes absolute memory for portion requests "
           "at bind")


def cel() -> str:
    return when(f"oldObject == null && {has_ann(ann.FRACTION)}",
                per_key(f"(k.endsWith({lit('.' + REQ)}) || k.endsWith({lit('.' + LIM)}))",
                        lambda _: lit(PROBLEM), keys="variables.keys"))


def check(values: Values) -> list[Violation]:
    """A portion's absolute memory is the scheduler's to write at bind (KAI: the binder writes the request)."""
    if values.shorthands.get(ann.FRACTION) is None or values.bound:
        return []
    return [annotation(key, value, PROBLEM)
            for entry in values.keys.values() for key, value in entry.items()
            if key.endswith((f".{Field.MEMORY_REQUEST}", f".{Field.MEMORY_LIMIT}"))]


RULE = Rule(
    "portionWithoutMemory", "a portion pod carries no absolute memory keys on CREATE",
    Scope.CREATE, Phase.VALUE, 110,
    check,
    cel(),
)
