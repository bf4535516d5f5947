"""The rule `modeAndDevicesNeedFraction`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import Field
from gpufrac.webhook.decide.cel import annotation_message, has_ann, lit
from gpufrac.webhook.decide.errors import Violation, annotation
from gpufrac.webhook.decide.rules.context import Values
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    LIM,
    MODE,
    REQ,
    field_key,
)
from gpufrac.webhook.decide.rules.variables import (
    has_field,
    is_written,
)


def cel() -> str:
    asks = (f"(c in variables.fractional || {has_field('c', REQ)} || {has_field('c', LIM)} || "
            f"({has_ann(ann.FRACTION)} && c == variables.target))")
    portion = (f"(c == variables.target ? {lit(ann.FRACTION)} : "
               f"{lit(ann.FRACTION + ' with ' + ann.CONTAINER_NAME + ': ')} + c)")
    mode_problem = (f"'needs a GPU memory request for container ' + c + ' (' + {field_key('c', REQ)} + ' or ' + "
                    f"{portion} + ')'")
    mode_key = field_key("c", MODE)
    mode_message = annotation_message(mode_key, f"variables.anns[{mode_key}]", mode_problem)
    out = (f"variables.entries.filter(c, !{asks} && {is_written('c', MODE)} && "
           f"!(c == variables.target && variables.modeOk)).map(c, {mode_message})")
    for bind_only in ann.BIND_ONLY_FIELDS:
        key = field_key("c", bind_only)
        message = annotation_message(key, f"variables.anns[{key}]",
                                     "'is set, but container ' + c + ' asks for no GPU fraction'")
        out += f" + variables.entries.filter(c, !{asks} && {is_written('c', bind_only)}).map(c, {message})"
    return out


def check(values: Values) -> list[Violation]:
    """A mode or a device list is for a container that holds a fraction."""
    out = []
    target = values.target.container
    for name, entry in sorted(values.requests.items()):
        if name in values.fractions or entry.asks_memory or (values.request.fraction_text is not None
                                                             and name == target):
            continue  # a fraction, or one whose values were wrong and are reported already
        if Field.COMPUTE_MODE in entry.keys.fields and entry.keys.key(Field.COMPUTE_MODE) not in values.translated:
            portion = ann.FRACTION if name == target else f"{ann.FRACTION} with {ann.CONTAINER_NAME}: {name}"
            out.append(annotation(entry.keys.key(Field.COMPUTE_MODE), entry.keys.fields[Field.COMPUTE_MODE],
                                  f"needs a GPU memory request for container {name} "
                                  f"({ann.nvidia_key(name, Field.MEMORY_REQUEST)} or {portion})"))
        for bind_only in ann.BIND_ONLY_FIELDS:
            if bind_only in entry.keys.fields:
                out.append(annotation(entry.keys.key(bind_only), entry.keys.fields[bind_only],
                                      f"is set, but container {name} asks for no GPU fraction"))
    return out


RULE = Rule(
    "modeAndDevicesNeedFraction", "a mode or devices only for a container with a fraction",
    Scope.POD, Phase.VALUE, 180,
    check,
    cel(),
)
