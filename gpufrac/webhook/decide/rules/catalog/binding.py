"""The rule `binding`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide import pod as podview
from gpufrac.webhook.decide.cel import annotation_message, lit, str_list
from gpufrac.webhook.decide.errors import Violation, annotation
from gpufrac.webhook.decide.rules.context import OwnRequest
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    KAI,
    NV,
)

PROBLEM = "cannot be set through a Binding (it would skip the gpufrac checks); set it on the pod before binding"


def cel() -> str:
    fraction_key = (f"(k in {str_list(ann.SHORTHAND_KEYS)} || k.startsWith({lit(NV)}) || k.startsWith({lit(KAI)}) "
                    f"|| k.startsWith({lit(ann.GPUFRAC_DOMAIN)}))")
    problem = lit(PROBLEM)
    return (f"variables.anns.filter(k, {fraction_key})"
            f".map(k, {annotation_message('k', 'variables.anns[k]', problem)})")


def check(request: OwnRequest) -> list[Violation]:
    """Annotations on a Binding are copied onto the pod without admission of the pod: none of ours may ride it."""
    annotations = podview.annotations(request.obj)
    return [annotation(k, annotations[k], PROBLEM) for k in sorted(annotations) if ann.is_fraction_key(k)]


RULE = Rule(
    "binding", "a Binding carries no fraction annotation",
    Scope.BINDING, Phase.OWN, 310,
    check,
    cel(),
)
