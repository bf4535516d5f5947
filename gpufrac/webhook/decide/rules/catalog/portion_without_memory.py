"""The rule `portionWithoutMemory`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.cel import has_ann, lit, when
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    LIM,
    REQ,
)
from gpufrac.webhook.decide.rules.variables import (
    per_key,
)


def cel() -> str:
    problem = (f"cannot be used together with {ann.FRACTION}: the scheduler writes absolute memory for portion "
               "requests at bind")
    return when(f"oldObject == null && {has_ann(ann.FRACTION)}",
                per_key(f"(k.endsWith({lit('.' + REQ)}) || k.endsWith({lit('.' + LIM)}))",
                        lambda _: lit(problem), keys="variables.keys"))


RULE = Rule(
    "portionWithoutMemory", "a portion pod carries no absolute memory keys on CREATE",
    Scope.CREATE, Phase.VALUE, 110,
    (fr.rule_portion_without_absolute_memory,),
    cel(),
)
