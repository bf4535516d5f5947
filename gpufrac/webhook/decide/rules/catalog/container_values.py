"""The rule `containerValues`: the reader that finds it (`reads`), its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.cel import annotation_message
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    CPORTION,
    DEV,
    LIM,
    MODE,
    PORTION,
    REQ,
    amount_problem,
    compute_portion_problem,
    devices_problem,
    mode_value_problem,
    portion_limit_problem,
)
from gpufrac.webhook.decide.rules.variables import (
    own_field,
)

_DECIMAL_DIGITS = ("a number in scientific notation whose plain form has more than 5 digits after the point "
                   "(123456e-6): CEL has no exact decimals")


def cel() -> str:
    """One pass over the kept keys: each key's value judged by the rule of its field (a key has one field)."""
    v = "variables.anns[k]"
    problem = "''"
    for field, judge in reversed([(REQ, amount_problem), (LIM, amount_problem), (MODE, mode_value_problem),
                                  (DEV, devices_problem), (PORTION, portion_limit_problem),
                                  (CPORTION, compute_portion_problem)]):
        problem = f"({own_field(field)} ? {judge(v)} : {problem})"
    return f"variables.ownKeys.filter(k, {problem} != '').map(k, {annotation_message('k', v, problem)})"


RULE = Rule(
    "containerValues", "per-container memory, mode, devices, compute portion and portion-limit values",
    Scope.POD, Phase.VALUE, 160,
    None,
    cel(),
    webhook_only="partly: " + _DECIMAL_DIGITS,
    reads=fr.read_container_request,
)
