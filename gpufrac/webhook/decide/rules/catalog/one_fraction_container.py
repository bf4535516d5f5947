"""The rule `oneFractionContainer`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.cel import one, when
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope


def cel() -> str:
    return when("!variables.allowMultiple && size(variables.fractional) > 1",
                one("'pod: asks for GPU fractions in ' + string(size(variables.fractional)) + ' containers (' + "
                    "variables.fractional.join(', ') + \"); KAI's binder binds the fraction of one container per pod, "
                    "so this pod would never start: put the GPU work in one container, or in separate pods\""))


RULE = Rule(
    "oneFractionContainer", "one fraction container per pod (KAI's binder)",
    Scope.POD, Phase.VALUE, 200,
    (fr.rule_one_fraction_container,),
    cel(),
)
