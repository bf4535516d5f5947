"""The rule `fractionLimit`: the reader that finds it (`reads`), its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    portion_limit_problem,
    shorthand_rule,
)

_DECIMAL_DIGITS = ("a number in scientific notation whose plain form has more than 5 digits after the point "
                   "(123456e-6): CEL has no exact decimals")


RULE = Rule(
    "fractionLimit", "gpu-fraction.limit lies strictly between gpu-fraction and 1, at most 5 digits",
    Scope.POD, Phase.VALUE, 60,
    None,
    shorthand_rule(ann.FRACTION_LIMIT, portion_limit_problem, "variables.fractionLimitOk"),
    webhook_only="partly: " + _DECIMAL_DIGITS,
    reads=fr.read_pod_request,
)
