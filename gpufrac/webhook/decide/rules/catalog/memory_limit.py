"""The rule `memoryLimit`: the reader that finds it (`reads`), its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    memory_limit_problem,
    shorthand_rule,
)

RULE = Rule(
    "memoryLimit", "gpu-memory.limit has a unit and is at least gpu-memory",
    Scope.POD, Phase.VALUE, 70,
    None,
    shorthand_rule(ann.MEMORY_LIMIT, memory_limit_problem, "variables.memoryLimitOk"),
    reads=fr.read_pod_request,
)
