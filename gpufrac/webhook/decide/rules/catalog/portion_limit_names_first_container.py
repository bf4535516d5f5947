"""The rule `portionLimitNamesFirstContainer`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide.cel import annotation_message, cat, has_ann, lit, one, when
from gpufrac.webhook.decide.errors import Violation, annotation
from gpufrac.webhook.decide.fractions import PORTION_LIMIT
from gpufrac.webhook.decide.rules.context import Values
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    PORTION,
    field_key,
)
from gpufrac.webhook.decide.rules.variables import (
    field_value,
    has_field,
)


def cel() -> str:
    """`check`: without gpu-fraction-container-name, a portion limit
    on a container the keys name, other than the first."""
    t = "variables.target"
    problem = cat(lit("applies to container "), t, lit(f", which the {ann.NVIDIA_PREFIX}"), t,
                  lit(".* annotations name, but KAI reads a portion limit as the first container's ("),
                  "variables.regular[0]", lit(f") unless {ann.CONTAINER_NAME} says otherwise: set "
                                              f"{ann.CONTAINER_NAME} to "), t)
    key = f"({has_ann(ann.FRACTION_LIMIT)} ? {lit(ann.FRACTION_LIMIT)} : {field_key(t, PORTION)})"
    return when(f"!{has_ann(ann.CONTAINER_NAME)} && {t} != '' && size(variables.regular) > 0 && "
                f"{t} != variables.regular[0] && {t} in variables.entries && {has_field(t, PORTION)}",
                one(annotation_message(key, field_value(t, PORTION), problem)))


def check(values: Values) -> list[Violation]:
    """KAI's validator reads a portion limit as the limit of gpu-fraction-container-name, else of the first container
    (validateGpuMemoryPortionLimitContainerName), even where its keys put the fraction on another container."""
    target, merged, containers = values.target, values.merged, values.containers
    name = target.container
    if target.explicit or name is None or name == containers.first or name not in merged \
            or PORTION_LIMIT not in merged[name].fields:
        return []
    key = merged[name].key(PORTION_LIMIT)
    written = ann.FRACTION_LIMIT if ann.FRACTION_LIMIT in values.shorthands.values else key
    return [annotation(written, merged[name].fields[PORTION_LIMIT], f"applies to container {name}, which the "
                       f"nvidia.com/container.{name}.* annotations name, but KAI reads a portion limit as the first "
                       f"container's ({containers.first}) unless {ann.CONTAINER_NAME} says otherwise: set "
                       f"{ann.CONTAINER_NAME} to {name}")]


RULE = Rule(
    "portionLimitNamesFirstContainer", "a portion limit on another container than the first names it",
    Scope.POD, Phase.VALUE, 155,
    check,
    cel(),
)
