"""The rule `binding`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide import validation as va
from gpufrac.webhook.decide.cel import annotation_message, lit, str_list
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    KAI,
    NV,
)


def cel() -> str:
    fraction_key = (f"(k in {str_list(ann.SHORTHAND_KEYS)} || k.startsWith({lit(NV)}) || k.startsWith({lit(KAI)}) "
                    f"|| k.startsWith({lit(ann.GPUFRAC_DOMAIN)}))")
    problem = lit("cannot be set through a Binding (it would skip the gpufrac checks); set it on the pod before "
                  "binding")
    return (f"variables.anns.filter(k, {fraction_key})"
            f".map(k, {annotation_message('k', 'variables.anns[k]', problem)})")


RULE = Rule(
    "binding", "a Binding carries no fraction annotation",
    Scope.BINDING, Phase.OWN, 310,
    (va.validate_binding,),
    cel(),
)
