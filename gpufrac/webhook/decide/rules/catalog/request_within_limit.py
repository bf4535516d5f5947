"""The rule `requestWithinLimit`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core.annotations import Field
from gpufrac.core.contract import (
    MIB,
)
from gpufrac.webhook.decide.cel import annotation_message, cat, lit
from gpufrac.webhook.decide.errors import Violation, annotation
from gpufrac.webhook.decide.rules.context import Values
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    LIM,
    field_key,
)
from gpufrac.webhook.decide.rules.variables import (
    at_container,
)


def cel() -> str:
    req, lim = at_container("requestText", "c"), at_container("limitText", "c")
    both = f"{req} != '' && {lim} != ''"
    q = f"quantity({req})"
    describe = (f"({q}.isInteger() && {q}.asInteger() % {MIB} == 0 ? string({q}.asInteger() / {MIB}) + ' MiB' : "
                f"{req})")
    problem = cat(lit("must not be smaller than the request ("), describe, lit(")"))
    message = annotation_message(field_key("c", LIM), lim, problem)
    return f"variables.entries.filter(c, {both} && quantity({lim}).isLessThan(quantity({req}))).map(c, {message})"


def check(values: Values) -> list[Violation]:
    """KAI: "request is greater than limit", compared in exact bytes (2047999Ki is below 2000Mi)."""
    out = []
    for _, entry in sorted(values.requests.items()):
        if entry.request is not None and entry.limit is not None and entry.limit.bytes < entry.request.bytes:
            key = entry.keys.key(Field.MEMORY_LIMIT)
            out.append(annotation(key, entry.limit.text, f"must not be smaller than the request "
                                                         f"({entry.request.describe()})"))
    return out


RULE = Rule(
    "requestWithinLimit", "request <= limit, in exact bytes",
    Scope.POD, Phase.VALUE, 170,
    check,
    cel(),
)
