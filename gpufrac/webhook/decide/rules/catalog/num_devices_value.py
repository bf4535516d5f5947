"""The rule `numDevicesValue`: the reader that finds it (`reads`), its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    num_devices_problem,
    shorthand_rule,
)

RULE = Rule(
    "numDevicesValue", "gpu-fraction-num-devices is 1 to 64",
    Scope.POD, Phase.VALUE, 80,
    None,
    shorthand_rule(ann.NUM_DEVICES, num_devices_problem),
    reads=fr.read_pod_request,
)
