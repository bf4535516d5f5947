"""The rule `containerLimitNeedsMemoryLimit`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.cel import has_ann, lit, when
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    LIM,
)
from gpufrac.webhook.decide.rules.variables import (
    per_key,
)


def cel() -> str:
    problem = (f"cannot be used together with {ann.MEMORY} alone: write the limit as {ann.MEMORY_LIMIT}, or write "
               "both request and limit per container")
    return when(f"{has_ann(ann.MEMORY)} && !{has_ann(ann.MEMORY_LIMIT)}",
                per_key(f"k.endsWith({lit('.' + LIM)})", lambda _: lit(problem), keys="variables.keys"))


RULE = Rule(
    "containerLimitNeedsMemoryLimit", "with gpu-memory alone, no per-container limit",
    Scope.POD, Phase.VALUE, 120,
    (fr.rule_container_limit_needs_memory_limit,),
    cel(),
)
