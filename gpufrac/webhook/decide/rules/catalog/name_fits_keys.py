"""The rule `nameFitsKeys`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.cel import lit, regex
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.variables import (
    has_portion_limit,
)


def cel() -> str:
    out = [f"variables.fractional.filter(c, !c.matches({regex(ann.CONTAINER_NAME_PATTERN)}))"
           ".map(c, 'container ' + c + ': has a name that cannot be part of an annotation key (a lowercase DNS-1123 "
           "label is needed); rename it')"]
    for portion_limit in (False, True):
        position, rest = fr.longest_key(portion_limit)
        allowed = ann.KEY_NAME_MAX - rest
        sample = fr.keys_for_name("<c>", portion_limit)[position]
        before, _, after = sample.partition("<c>")
        has_limit = has_portion_limit("c")
        head = lit(f": has a name longer than {allowed} characters, too long for the annotation key {before}")
        tail = lit(f"{after} (at most {ann.KEY_NAME_MAX} characters after the /); shorten it")
        negate = "" if portion_limit else "!"
        # The length first: the portion limit's check (a number's parsing) runs only for a name that long.
        out.append(f"variables.fractional.filter(c, size(c) > {allowed} && "
                   f"c.matches({regex(ann.CONTAINER_NAME_PATTERN)}) && {negate}{has_limit})"
                   f".map(c, 'container ' + c + {head} + c + {tail})")
    return " + ".join(out)


RULE = Rule(
    "nameFitsKeys", "a fraction container's name fits in every key",
    Scope.POD, Phase.VALUE, 230,
    (fr.rule_name_fits_the_keys,),
    cel(),
)
