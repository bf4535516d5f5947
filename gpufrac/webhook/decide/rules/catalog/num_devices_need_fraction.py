"""The rule `numDevicesNeedFraction`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import Field
from gpufrac.webhook.decide.cel import ann as a
from gpufrac.webhook.decide.cel import annotation_message, has_ann, lit, one, when
from gpufrac.webhook.decide.errors import Violation, annotation
from gpufrac.webhook.decide.rules.context import Values
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    LIM,
    REQ,
)

PROBLEM = f"needs a fraction to apply to: {ann.FRACTION}, {ann.MEMORY} or nvidia.com/container.<c>.gpu-memory.request"


def cel() -> str:
    memory_keys = f"variables.keys.exists(k, k.endsWith({lit('.' + REQ)}) || k.endsWith({lit('.' + LIM)}))"
    return when(f"{has_ann(ann.NUM_DEVICES)} && !{has_ann(ann.FRACTION)} && !{has_ann(ann.MEMORY)} && "
                f"!{memory_keys}", one(annotation_message(lit(ann.NUM_DEVICES), a(ann.NUM_DEVICES), lit(PROBLEM))))


def check(values: Values) -> list[Violation]:
    """KAI: "cannot request multiple fractional devices without specifying fraction details"."""
    shorthands = values.shorthands
    text = shorthands.get(ann.NUM_DEVICES)
    memory_keys = any(f in entry.fields for entry in values.keys.values()
                      for f in (Field.MEMORY_REQUEST, Field.MEMORY_LIMIT))
    if text is None or shorthands.get(ann.FRACTION) is not None or shorthands.get(ann.MEMORY) is not None \
            or memory_keys:
        return []
    return [annotation(ann.NUM_DEVICES, text, PROBLEM)]


RULE = Rule(
    "numDevicesNeedFraction", "gpu-fraction-num-devices needs a fraction",
    Scope.POD, Phase.VALUE, 140,
    check,
    cel(),
)
