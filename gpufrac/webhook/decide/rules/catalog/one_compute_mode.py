"""The rule `oneComputeMode`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.webhook.decide.cel import lit, one, when
from gpufrac.webhook.decide.errors import Violation
from gpufrac.webhook.decide.rules.context import Values
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.variables import (
    mode_of,
)

_SHARE_ONE_MODE = "a pod's fractions share one mode, so set the same gpu-compute.mode on each"


def cel() -> str:
    modes = "variables.fractionalModes"
    return when(f"{modes}.exists(m, m != {modes}[0])",
                one(f"'pod: mixes compute modes across containers (' + variables.fractional.map(c, c + '=' + "
                    f"{mode_of('c')}).join(', ') + {lit('); ' + _SHARE_ONE_MODE)}"))


def check(values: Values) -> list[Violation]:
    fractions = values.fractions
    if len({c.mode for c in fractions.values()}) < 2:
        return []
    listing = ", ".join(f"{c.container}={c.mode}" for c in fractions.values())
    return [Violation("pod", f"mixes compute modes across containers ({listing}); {_SHARE_ONE_MODE}")]


RULE = Rule(
    "oneComputeMode", "the fractions of a pod share one compute mode",
    Scope.POD, Phase.VALUE, 210,
    check,
    cel(),
)
