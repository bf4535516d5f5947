"""The rule `keysNameTheTarget`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide.cel import annotation_message, has_ann, when
from gpufrac.webhook.decide.errors import Violation, annotation
from gpufrac.webhook.decide.fractions import keyed_container
from gpufrac.webhook.decide.rules.context import Values
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


def check(values: Values) -> list[Violation]:
    """With pod-level shorthands, the per-container keys name the container they apply to, which is the target
    (KAI: "gpu-fraction-container-name annotation value ... does not match container name ...")."""
    targeting, target, keys = values.shorthands.targeting(), values.target, values.keys
    if not targeting or target.container is None:
        return []
    out = []
    several = keyed_container(keys) is None and len(keys) > 1
    keyed_listing = ", ".join(sorted(keys))  # once: every key's message names them all
    for name in sorted(keys.keys() - {target.container}):
        for key, value in keys[name].items():
            if target.explicit:
                problem = (f"names container {name}, but {ann.CONTAINER_NAME} is {target.container}; the fraction "
                           "annotations of a pod name one container")
            elif several:
                problem = (f"names container {name}, but the fraction annotations of this pod name "
                           f"{keyed_listing}; they name one container, which {targeting[0]} applies to")
            else:
                problem = (f"names container {name}, but {targeting[0]} applies to {target.container}; set "
                           f"{ann.CONTAINER_NAME} to {name}")
            out.append(annotation(key, value, problem))
    return out


RULE = Rule(
    "keysNameTheTarget", "with shorthands, per-container keys name the shorthands' container",
    Scope.POD, Phase.VALUE, 150,
    check,
    cel(),
)
