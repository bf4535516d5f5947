"""The rule `modeShorthand`: the reader that finds it (`reads`), its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.cel import when
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    mode_value_problem,
    shorthand_rule,
)

RULE = Rule(
    "modeShorthand", "the pod-level compute mode is a mode (on a pod with a fraction)",
    Scope.POD, Phase.VALUE, 90,
    None,
    when("size(variables.fractional) > 0", shorthand_rule(ann.COMPUTE_MODE, mode_value_problem, "variables.modeOk")),
    webhook_only=("partly: on a pod without a fraction the webhook judges the value only beside another wrong value (a "
                  "lone mode is allowed with a warning, `resolve.lone_compute_mode`)"),
    reads=fr.read_pod_request,
)
