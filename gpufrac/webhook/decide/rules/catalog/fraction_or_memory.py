"""The rule `fractionOrMemory`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.cel import ann as a
from gpufrac.webhook.decide.cel import annotation_message, has_ann, lit, one, when
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope


def cel() -> str:
    problem = f"cannot be used together with {ann.FRACTION}: ask for a portion or for an amount of memory, not both"
    return when(f"{has_ann(ann.FRACTION)} && {has_ann(ann.MEMORY)}",
                one(annotation_message(lit(ann.MEMORY), a(ann.MEMORY), lit(problem))))


RULE = Rule(
    "fractionOrMemory", "gpu-fraction and gpu-memory are not both set",
    Scope.POD, Phase.VALUE, 100,
    (fr.rule_fraction_or_memory,),
    cel(),
)
