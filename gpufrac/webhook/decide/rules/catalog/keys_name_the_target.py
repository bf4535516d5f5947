"""The rule `keysNameTheTarget`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.cel import annotation_message, has_ann, when
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    container_of,
)


def cel() -> str:
    c = container_of("k")
    explicit = (f"'names container ' + {c} + ', but {ann.CONTAINER_NAME} is ' + variables.target + "
                "'; the fraction annotations of a pod name one container'")
    implied = (f"'names container ' + {c} + ', but ' + variables.targeting[0] + ' applies to ' + variables.target + "
               f"'; set {ann.CONTAINER_NAME} to ' + {c}")
    keyed = f"variables.names.filter(n, variables.keys.exists(k, {container_of('k')} == n))"
    several = (f"'names container ' + {c} + ', but the fraction annotations of this pod name ' + "
               f"variables.keyedListing + '; they name one container, which ' + variables.targeting[0] + "
               "' applies to'")
    implied = f"(size(variables.keyed) != 1 && size({keyed}) > 1 ? {several} : {implied})"
    problem = f"({has_ann(ann.CONTAINER_NAME)} ? {explicit} : {implied})"
    message = annotation_message("k", "variables.anns[k]", problem)
    return when("variables.offTarget", f"variables.keys.filter(k, {c} != variables.target).map(k, {message})")


RULE = Rule(
    "keysNameTheTarget", "with shorthands, per-container keys name the shorthands' container",
    Scope.POD, Phase.VALUE, 150,
    (fr.rule_keys_name_the_target,),
    cel(),
)
