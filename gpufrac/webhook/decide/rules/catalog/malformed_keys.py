"""The rule `malformedKeys`: the reader that finds it (`reads`), its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.cel import lit, regex
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    KAI,
    NV,
    OURS,
    well_formed,
)


def cel() -> str:
    cases = []
    for prefix in (NV, KAI, OURS):
        accepted = ann.MalformedKeyError(prefix, ann.accepted_keys(prefix)).accepted
        cases.append((f"k.startsWith({lit(prefix)}) && !k.matches({regex(well_formed(prefix))})", accepted))
    other = ann.MalformedKeyError(ann.GPUFRAC_DOMAIN, ann.accepted_keys(ann.GPUFRAC_DOMAIN)).accepted
    select = " || ".join(f"({c})" for c, _ in cases) + f" || (k.startsWith({lit(ann.GPUFRAC_DOMAIN)}) && " \
                                                       f"!k.startsWith({lit(OURS)}))"
    accepted = lit(other)
    for condition, text in reversed(cases):
        accepted = f"({condition} ? {lit(text)} : {accepted})"
    message = f"'annotation ' + k + ': is not a key gpufrac knows: ' + {accepted}"
    return f"variables.prefixedKeys.filter(k, {select}).map(k, {message})"


RULE = Rule(
    "malformedKeys", "keys under gpufrac's prefixes follow the grammar",
    Scope.POD, Phase.VALUE, 10,
    None,
    cel(),
    reads=fr.read_container_keys,
)
