"""The rule `targetContainer`: the reader that finds it (`reads`), its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.cel import ann as a
from gpufrac.webhook.decide.cel import annotation_message, has_ann, lit, one, when
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope


def cel() -> str:
    v = a(ann.CONTAINER_NAME)
    return when(f"{has_ann(ann.CONTAINER_NAME)} && !({v} in variables.names)",
                one(annotation_message(lit(ann.CONTAINER_NAME), v,
                                       "'must name a container of the pod: ' + variables.listing")))


RULE = Rule(
    "targetContainer", "gpu-fraction-container-name names a container",
    Scope.POD, Phase.VALUE, 30,
    None,
    cel(),
    reads=fr.read_target,
)
