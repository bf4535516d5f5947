"""The rule `status`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.core.contract import (
    FRACTIONAL_LABEL,
)
from gpufrac.webhook.decide import validation as va
from gpufrac.webhook.decide.cel import annotation_message, lit, one, str_list, when
from gpufrac.webhook.decide.rules.parts import same_label
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    KAI,
    NV,
)


def cel() -> str:
    old, new = "oldObject.metadata.?annotations.orValue({})", "variables.anns"
    fraction_key = (f"(k in {str_list(ann.SHORTHAND_KEYS)} || k.startsWith({lit(NV)}) || k.startsWith({lit(KAI)}) "
                    f"|| k.startsWith({lit(ann.GPUFRAC_DOMAIN)}))")
    problem = lit("cannot be changed through pods/status")
    label_old = "oldObject.metadata.?labels.orValue({})"
    changed = annotation_message("k", f"{new}[k]", problem)
    removed = annotation_message("k", f"{old}[k]", problem)
    return (f"{new}.filter(k, {fraction_key} && (!(k in {old}) || {old}[k] != {new}[k])).map(k, {changed}) + "
            f"{old}.filter(k, {fraction_key} && !(k in {new})).map(k, {removed}) + "
            + when(f"!({same_label(label_old, 'variables.labels')})",
                   one(lit(f"label {FRACTIONAL_LABEL}: cannot be changed through pods/status"))))


RULE = Rule(
    "status", "pods/status changes no fraction annotation and not the label",
    Scope.STATUS, Phase.OWN, 300,
    (va.validate_status,),
    cel(),
)
