"""The rule `numDevicesNeedFraction`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.cel import ann as a
from gpufrac.webhook.decide.cel import annotation_message, has_ann, lit, one, when
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    LIM,
    REQ,
)


def cel() -> str:
    problem = (f"needs a fraction to apply to: {ann.FRACTION}, {ann.MEMORY} or "
               "nvidia.com/container.<c>.gpu-memory.request")
    memory_keys = f"variables.keys.exists(k, k.endsWith({lit('.' + REQ)}) || k.endsWith({lit('.' + LIM)}))"
    return when(f"{has_ann(ann.NUM_DEVICES)} && !{has_ann(ann.FRACTION)} && !{has_ann(ann.MEMORY)} && "
                f"!{memory_keys}", one(annotation_message(lit(ann.NUM_DEVICES), a(ann.NUM_DEVICES), lit(problem))))


RULE = Rule(
    "numDevicesNeedFraction", "gpu-fraction-num-devices needs a fraction",
    Scope.POD, Phase.VALUE, 140,
    (fr.rule_num_devices_need_a_fraction,),
    cel(),
)
