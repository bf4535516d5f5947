"""The rule `containerLimitNeedsMemoryLimit`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import Field
from gpufrac.webhook.decide.cel import has_ann, lit, when
from gpufrac.webhook.decide.errors import Violation, annotation
from gpufrac.webhook.decide.rules.context import Values
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    LIM,
)
from gpufrac.webhook.decide.rules.variables import (
    per_key,
)

PROBLEM = (f"cannot be used together with {ann.MEMORY} alone: write the limit as {ann.MEMORY_LIMIT}, or write both "
           "request and limit per container")


def cel() -> str:
    return when(f"{has_ann(ann.MEMORY)} && !{has_ann(ann.MEMORY_LIMIT)}",
                per_key(f"k.endsWith({lit('.' + LIM)})", lambda _: lit(PROBLEM), keys="variables.keys"))


def check(values: Values) -> list[Violation]:
    """KAI: "cannot combine nvidia.com/container. limit annotation with gpu-fraction or gpu-memory annotation"
    (with gpu-memory, allowed only next to gpu-memory.limit)."""
    shorthands = values.shorthands
    if shorthands.get(ann.MEMORY) is None or shorthands.get(ann.MEMORY_LIMIT) is not None:
        return []
    return [annotation(key, value, PROBLEM)
            for entry in values.keys.values() for key, value in entry.items() if key.endswith(f".{Field.MEMORY_LIMIT}")]


RULE = Rule(
    "containerLimitNeedsMemoryLimit", "with gpu-memory alone, no per-container limit",
    Scope.POD, Phase.VALUE, 120,
    check,
    cel(),
)
