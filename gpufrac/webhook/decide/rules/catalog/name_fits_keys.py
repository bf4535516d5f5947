"""The rule `nameFitsKeys`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

import functools

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import Field
from gpufrac.webhook.decide.cel import lit, regex
from gpufrac.webhook.decide.errors import Violation
from gpufrac.webhook.decide.fractions import ContainerFraction
from gpufrac.webhook.decide.rules.context import Values
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.variables import (
    has_portion_limit,
)


def keys_for(fraction: ContainerFraction, name: str | None = None) -> list[str]:
    """Every key gpufrac or the scheduler writes for this container (or for one named `name` instead): the
    canonical ones, the scheduler's bind-time ones, and the portion limit where one is used."""
    return keys_for_name(fraction.container if name is None else name, _has_portion_limit(fraction))


def _has_portion_limit(fraction: ContainerFraction) -> bool:
    return fraction.portion is not None and fraction.portion.limit is not None


def keys_for_name(name: str, portion_limit: bool) -> list[str]:
    keys = [ann.canonical_key(name, f) for f in ann.CanonicalField]
    keys += [ann.nvidia_key(name, f) for f in (Field.MEMORY_REQUEST, Field.MEMORY_LIMIT, Field.DEVICES)]
    if portion_limit:
        keys.append(ann.portion_limit_key(name))
    return keys


@functools.cache  # two possible answers
def longest_key(portion_limit: bool) -> tuple[int, int]:
    """(position in `keys_for_name`, length of its name part less the container name) of the key with the longest
    rest: the keys differ only in the container name, so that one decides how long a name may be."""
    rests = [ann.key_name_length(k) for k in keys_for_name("", portion_limit)]
    longest = max(rests)
    return rests.index(longest), longest


def check(values: Values) -> list[Violation]:
    return [v for fraction in values.fractions.values() for v in _name_fits(fraction)]


def _name_fits(fraction: ContainerFraction) -> list[Violation]:
    """The container name is part of each key, whose name part Kubernetes caps at 63 characters."""
    name = fraction.container
    if not ann.is_container_name(name):
        return [Violation(f"container {name}", "has a name that cannot be part of an annotation key (a lowercase "
                                               "DNS-1123 label is needed); rename it")]
    position, rest = longest_key(_has_portion_limit(fraction))
    allowed = ann.KEY_NAME_MAX - rest
    if len(name) <= allowed:
        return []
    key = keys_for(fraction)[position]
    return [Violation(f"container {name}", f"has a name longer than {allowed} characters, too long for the annotation "
                                           f"key {key} (at most {ann.KEY_NAME_MAX} characters after the /); shorten "
                                           "it")]


def cel() -> str:
    out = [f"variables.fractional.filter(c, !c.matches({regex(ann.CONTAINER_NAME_PATTERN)}))"
           ".map(c, 'container ' + c + ': has a name that cannot be part of an annotation key (a lowercase DNS-1123 "
           "label is needed); rename it')"]
    for portion_limit in (False, True):
        position, rest = longest_key(portion_limit)
        allowed = ann.KEY_NAME_MAX - rest
        sample = keys_for_name("<c>", portion_limit)[position]
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
    check,
    cel(),
    by_fraction=True,
)
