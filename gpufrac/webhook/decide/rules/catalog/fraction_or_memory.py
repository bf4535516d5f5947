"""The rule `fractionOrMemory`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide.cel import ann as a
from gpufrac.webhook.decide.cel import annotation_message, has_ann, lit, one, when
from gpufrac.webhook.decide.errors import Violation, annotation
from gpufrac.webhook.decide.rules.context import Values
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope

PROBLEM = f"cannot be used together with {ann.FRACTION}: ask for a portion or for an amount of memory, not both"


def cel() -> str:
    return when(f"{has_ann(ann.FRACTION)} && {has_ann(ann.MEMORY)}",
                one(annotation_message(lit(ann.MEMORY), a(ann.MEMORY), lit(PROBLEM))))


def check(values: Values) -> list[Violation]:
    """KAI: "cannot request both gpu-fraction and GPU memory request"."""
    shorthands = values.shorthands
    if shorthands.get(ann.FRACTION) is None or shorthands.get(ann.MEMORY) is None:
        return []
    return [annotation(ann.MEMORY, shorthands.values[ann.MEMORY], PROBLEM)]


RULE = Rule(
    "fractionOrMemory", "gpu-fraction and gpu-memory are not both set",
    Scope.POD, Phase.VALUE, 100,
    check,
    cel(),
)
