"""The rule `oneComputeMode`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.cel import one, when
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.variables import (
    mode_of,
)


def cel() -> str:
    modes = "variables.fractionalModes"
    return when(f"{modes}.exists(m, m != {modes}[0])",
                one(f"'pod: mixes compute modes across containers (' + variables.fractional.map(c, c + '=' + "
                    f"{mode_of('c')}).join(', ') + \"); a pod's fractions share one mode, so set the same "
                    "gpu-compute.mode on each\""))


RULE = Rule(
    "oneComputeMode", "the fractions of a pod share one compute mode",
    Scope.POD, Phase.VALUE, 210,
    (fr.rule_one_compute_mode,),
    cel(),
)
