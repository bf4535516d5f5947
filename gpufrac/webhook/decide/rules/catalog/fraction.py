"""The rule `fraction`: the reader that finds it (`reads`), its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    fraction_problem,
    shorthand_rule,
)

RULE = Rule(
    "fraction", "gpu-fraction is a decimal in (0, 1) KAI can bind",
    Scope.POD, Phase.VALUE, 40,
    None,
    shorthand_rule(ann.FRACTION, fraction_problem, "variables.fractionOk"),
    webhook_only="partly: a number in (0, 1) that binary64 reads as 0 or 1 is denied with the range message, not with "
         "\"as KAI's scheduler reads it\"",
    reads=fr.read_pod_request,
)
