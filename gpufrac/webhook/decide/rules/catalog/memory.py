"""The rule `memory`: the reader that finds it (`reads`), its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    memory_mib_problem,
    shorthand_rule,
)

RULE = Rule(
    "memory", "gpu-memory is a whole number of MiB",
    Scope.POD, Phase.VALUE, 50,
    None,
    shorthand_rule(ann.MEMORY, memory_mib_problem, "variables.memoryOk"),
    reads=fr.read_pod_request,
)
