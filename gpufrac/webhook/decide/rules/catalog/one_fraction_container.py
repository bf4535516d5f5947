"""The rule `oneFractionContainer`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.webhook.decide.cel import lit, one, when
from gpufrac.webhook.decide.errors import Violation
from gpufrac.webhook.decide.rules.context import Values
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope

_NEVER_STARTS = ("KAI's binder binds the fraction of one container per pod, so this pod would never start: put the "
                 "GPU work in one container, or in separate pods")


def cel() -> str:
    return when("!variables.allowMultiple && size(variables.fractional) > 1",
                one("'pod: asks for GPU fractions in ' + string(size(variables.fractional)) + ' containers (' + "
                    f"variables.fractional.join(', ') + {lit('); ' + _NEVER_STARTS)}"))


def check(values: Values) -> list[Violation]:
    """KAI's binder binds one fraction container per pod (GetFractionContainerRef): a pod with more never starts."""
    fractions = values.fractions
    if values.allow_multiple or len(fractions) < 2:
        return []
    return [Violation("pod", f"asks for GPU fractions in {len(fractions)} containers ({', '.join(fractions)}); "
                             f"{_NEVER_STARTS}")]


RULE = Rule(
    "oneFractionContainer", "one fraction container per pod (KAI's binder)",
    Scope.POD, Phase.VALUE, 200,
    check,
    cel(),
)
