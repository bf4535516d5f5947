"""The rule `status`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from typing import Any

from gpufrac.core import annotations as ann
from gpufrac.core.contract import (
    FRACTIONAL_LABEL,
)
from gpufrac.webhook.decide import pod as podview
from gpufrac.webhook.decide.cel import annotation_message, lit, one, str_list, when
from gpufrac.webhook.decide.errors import Violation, annotation
from gpufrac.webhook.decide.rules.context import OwnRequest
from gpufrac.webhook.decide.rules.parts import same_label
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    KAI,
    NV,
)

PROBLEM = "cannot be changed through pods/status"


def cel() -> str:
    old, new = "oldObject.metadata.?annotations.orValue({})", "variables.anns"
    fraction_key = (f"(k in {str_list(ann.SHORTHAND_KEYS)} || k.startsWith({lit(NV)}) || k.startsWith({lit(KAI)}) "
                    f"|| k.startsWith({lit(ann.GPUFRAC_DOMAIN)}))")
    problem = lit(PROBLEM)
    label_old = "oldObject.metadata.?labels.orValue({})"
    changed = annotation_message("k", f"{new}[k]", problem)
    removed = annotation_message("k", f"{old}[k]", problem)
    return (f"{new}.filter(k, {fraction_key} && (!(k in {old}) || {old}[k] != {new}[k])).map(k, {changed}) + "
            f"{old}.filter(k, {fraction_key} && !(k in {new})).map(k, {removed}) + "
            + when(f"!({same_label(label_old, 'variables.labels')})",
                   one(lit(f"label {FRACTIONAL_LABEL}: {PROBLEM}"))))


def check(request: OwnRequest) -> list[Violation]:
    """pods/status may write metadata too: none of the fraction annotations, ours, or the label may change there."""
    obj, old = request.obj, request.old or {}

    def guarded(pod: dict[str, Any]) -> dict[str, str]:
        return {k: v for k, v in podview.annotations(pod).items() if ann.is_fraction_key(k)}

    before, after = guarded(old), guarded(obj)
    out = [annotation(key, after.get(key, before.get(key)), PROBLEM)
           for key in sorted(before.keys() | after.keys()) if before.get(key) != after.get(key)]
    if podview.labels(old).get(FRACTIONAL_LABEL) != podview.labels(obj).get(FRACTIONAL_LABEL):
        out.append(Violation(f"label {FRACTIONAL_LABEL}", PROBLEM))
    return out


RULE = Rule(
    "status", "pods/status changes no fraction annotation and not the label",
    Scope.STATUS, Phase.OWN, 300,
    check,
    cel(),
)
