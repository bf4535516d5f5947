"""The rule `translationAgrees`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import Field
from gpufrac.core.quantity import QuantityError, parse, parse_decimal
from gpufrac.webhook.decide.cel import annotation_message, lit, one, when
from gpufrac.webhook.decide.errors import Violation, annotation
from gpufrac.webhook.decide.fractions import PORTION_LIMIT
from gpufrac.webhook.decide.rules.context import Values
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    LIM,
    MODE,
    PORTION,
    REQ,
    field_key,
    number_ok,
    quantity_ok,
)
from gpufrac.webhook.decide.rules.variables import (
    TRANSLATED_OK,
    translated_value,
)


def cel() -> str:
    """`check`: the target's written keys say what their shorthands say."""
    out = []
    t = "variables.target"
    for field, source in ((MODE, ann.COMPUTE_MODE), (LIM, ann.MEMORY_LIMIT), (REQ, ann.MEMORY),
                          (PORTION, ann.FRACTION_LIMIT)):
        key, wanted = field_key(t, field), translated_value(field)
        written = f"variables.anns[{key}]"
        if field in (REQ, LIM):
            same = f"({quantity_ok(written)} && quantity({written}).compareTo(quantity({wanted})) == 0)"
        elif field == PORTION:
            same = f"({number_ok(written)} && double({written}) == double({wanted}))"
        else:
            same = "false"
        reworded = lit(f"says what {source} says, written differently; KAI's admission compares the text and denies "
                       "it: write ")
        differs = (f"({same} ? {reworded} + {wanted} + ' or drop one of them' : "
                   f"{lit('does not match ' + source + ' (')} + {wanted} + '); write one of them')")
        out.append(when(f"{t} != '' && {TRANSLATED_OK[field]} && ({key}) in variables.anns && {written} != {wanted} "
                        f"&& !(oldObject != null && {same})",
                        one(annotation_message(key, written, differs))))
    # Sorted by field name, as the webhook does: gpu-compute.mode, gpu-memory.limit, gpu-memory.portion.limit
    # (KAI's prefix), gpu-memory.request.
    return " + ".join([out[0], out[1], out[3], out[2]])


# The shorthand each translated field comes from.
_SOURCE_OF: dict[str, str] = {Field.MEMORY_REQUEST: ann.MEMORY, Field.MEMORY_LIMIT: ann.MEMORY_LIMIT,
                              PORTION_LIMIT: ann.FRACTION_LIMIT, Field.COMPUTE_MODE: ann.COMPUTE_MODE}


def check(values: Values) -> list[Violation]:
    """A per-container key the pod already has must say what its shorthand says. On CREATE as text: KAI's admission
    compares the strings and denies a difference ("... annotation conflicts with ..."). After CREATE by value, as
    its validator does, so pods written by an older gpufrac still bind."""
    translation, bound = values.translation, values.bound
    if translation is None:
        return []
    out = []
    for name, wanted in sorted(translation.fields.items()):
        key = translation.key(name)
        written = values.annotations.get(key)
        if written is None or written == wanted or (bound and _same_value(key, written, wanted)):
            continue
        if _same_value(key, written, wanted):
            problem = (f"says what {_SOURCE_OF[name]} says, written differently; KAI's admission compares the text "
                       f"and denies it: write {wanted} or drop one of them")
        else:
            problem = f"does not match {_SOURCE_OF[name]} ({wanted}); write one of them"
        out.append(annotation(key, written, problem))
    return out


def _same_value(key: str, written: str, wanted: str) -> bool:
    try:
        if key.endswith((f".{Field.MEMORY_REQUEST}", f".{Field.MEMORY_LIMIT}")):
            return parse(written).value == parse(wanted).value
        if key.endswith(f".{PORTION_LIMIT}"):
            return parse_decimal(written) == parse_decimal(wanted)
    except QuantityError:
        return False
    return False


RULE = Rule(
    "translationAgrees", "a per-container key says what its shorthand says",
    Scope.POD, Phase.VALUE, 130,
    check,
    cel(),
)
