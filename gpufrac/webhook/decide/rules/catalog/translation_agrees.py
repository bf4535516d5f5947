"""The rule `translationAgrees`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.cel import annotation_message, lit, one, when
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
    """`fractions.rule_translation_agrees`: the target's written keys say what their shorthands say."""
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


RULE = Rule(
    "translationAgrees", "a per-container key says what its shorthand says",
    Scope.POD, Phase.VALUE, 130,
    (fr.rule_translation_agrees, fr.translate),
    cel(),
)
