"""The rule `immutable`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import Field
from gpufrac.core.contract import (
    FRACTIONAL_LABEL,
)
from gpufrac.webhook.decide import pod as podview
from gpufrac.webhook.decide.cel import annotation_message, cat, lit, one, when
from gpufrac.webhook.decide.errors import Violation, annotation
from gpufrac.webhook.decide.fractions import PodFractions, portion_container
from gpufrac.webhook.decide.policy import Policy, UserInfo
from gpufrac.webhook.decide.rules.context import PodReview
from gpufrac.webhook.decide.rules.parts import bind_only, same_label, user_fraction_keys, user_keys
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    LIM,
    NV,
    REQ,
)

IMMUTABLE = "fraction annotations cannot change after the pod is created; delete and recreate the pod"


def cel() -> str:
    """`check` on UPDATE, for everyone but the scheduler adding keys (its bind)."""
    old = "variables.oldAnns"
    new, immutable = "variables.anns", lit("; " + IMMUTABLE)
    user = "(request.userInfo.username != '' ? request.userInfo.username : 'this user')"
    bind_shape = (f"({bind_only('k')} || (k.startsWith({lit(NV)}) && (k.endsWith({lit('.' + REQ)}) || "
                  f"k.endsWith({lit('.' + LIM)}))))")
    why = f"({bind_shape} ? 'only the scheduler may add it, at bind' : {lit(IMMUTABLE)})"
    removed_message = annotation_message("k", f"{old}[k]", cat("'was removed'", immutable))
    changed_message = annotation_message("k", f"{new}[k]", cat("'was changed from '", f"{old}[k]", immutable))
    added_message = annotation_message("k", f"{new}[k]", cat("'cannot be added by '", user, "': '", why))
    removed = f"{user_keys(old)}.filter(k, !(k in {new})).map(k, {removed_message})"
    changed = f"variables.userKeys.filter(k, k in {old} && {old}[k] != {new}[k]).map(k, {changed_message})"
    added = when("!variables.isScheduler", f"variables.userKeys.filter(k, !(k in {old})).map(k, {added_message})")
    label = "oldObject.metadata.?labels.orValue({})"
    relabel = when(f"{lit(FRACTIONAL_LABEL)} in {label} && !({same_label(label, 'variables.labels')})",
                   one(lit(f"label {FRACTIONAL_LABEL}: is set by gpufrac and cannot be changed or removed")))
    return when("oldObject != null", f"{removed} + {changed} + {added} + {relabel}")



def _is_bind_key(key: str, portion: str | None) -> bool:
    """Keys the scheduler adds at bind: devices, and absolute memory for the container that asked for a portion
    (`portion`: that container of the pod before the UPDATE)."""
    try:
        parsed = ann.parse_container_key(key)
    except ann.MalformedKeyError:
        return False  # `resolve` reports it
    if parsed is None or parsed.prefix != ann.NVIDIA_PREFIX:
        return False
    if parsed.suffix in ann.BIND_ONLY_FIELDS:
        return True
    if parsed.suffix in (Field.MEMORY_REQUEST, Field.MEMORY_LIMIT):
        return portion is not None and parsed.container == portion
    return False


def authorship_on_update(old: dict[str, Any], new: dict[str, Any], user: UserInfo, policy: Policy,
                         old_fractions: Callable[[], PodFractions]) -> list[Violation]:
    """No fraction annotation and not the label changes after CREATE, but what the scheduler adds at bind."""
    out: list[Violation] = []
    new_keys = user_fraction_keys(podview.annotations(new))
    old_keys = user_fraction_keys(podview.annotations(old))
    # The scheduler adding keys (its bind) needs only which container of the old pod holds a portion.
    binding = policy.is_scheduler(user) and bool(new_keys.keys() - old_keys.keys())
    portion = portion_container(old) if binding else None
    holders = functools.cache(lambda: ", ".join(sorted(old_fractions().names())) or "no container")  # once
    for key in sorted(old_keys.keys() | new_keys.keys()):
        if key not in new_keys:
            out.append(annotation(key, old_keys[key], f"was removed; {IMMUTABLE}"))
        elif key not in old_keys:
            if not (binding and _is_bind_key(key, portion)):
                why = _not_a_bind_key(key, old_fractions, holders) if binding else _not_the_scheduler(key)
                out.append(annotation(key, new_keys[key], f"cannot be added by {user.username or 'this user'}: {why}"))
        elif old_keys[key] != new_keys[key]:
            out.append(annotation(key, new_keys[key], f"was changed from {old_keys[key]}; {IMMUTABLE}"))
    old_label = podview.labels(old).get(FRACTIONAL_LABEL)
    if old_label is not None and podview.labels(new).get(FRACTIONAL_LABEL) != old_label:
        out.append(Violation(f"label {FRACTIONAL_LABEL}", "is set by gpufrac and cannot be changed or removed"))
    return out


def _not_the_scheduler(key: str) -> str:
    return "only the scheduler may add it, at bind" if _bind_shape(key) else IMMUTABLE


def _not_a_bind_key(key: str, old_fractions: Callable[[], PodFractions], holders: Callable[[], str]) -> str:
    """Why the scheduler may not add this key (it is the scheduler: "only the scheduler may" would not help)."""
    try:
        parsed = ann.parse_container_key(key)
    except ann.MalformedKeyError:
        parsed = None  # `resolve` reports the key itself
    if parsed is None or not _bind_shape(key):
        return IMMUTABLE
    name = parsed.container
    if name not in old_fractions().containers:
        return (f"container {name} holds no GPU fraction, so there is nothing to bind for it; "
                f"{holders()} of this pod holds one")
    return (f"container {name} asked for absolute memory, which is written on create; the scheduler adds "
            f"gpu-memory.request and .limit at bind only for a portion ({ann.FRACTION})")


def _bind_shape(key: str) -> bool:
    return key.startswith(ann.NVIDIA_PREFIX) and key.endswith(
        (*(f".{f}" for f in ann.BIND_ONLY_FIELDS), f".{Field.MEMORY_REQUEST}", f".{Field.MEMORY_LIMIT}"))


def check(review: PodReview) -> list[Violation]:
    if review.old is None:
        return []
    return authorship_on_update(review.old, review.obj, review.user, review.policy, review.old_fractions)


RULE = Rule(
    "immutable", "fraction annotations and the label do not change after CREATE (but the scheduler's bind)",
    Scope.UPDATE, Phase.AUTHORSHIP, 250,
    check,
    cel(),
    webhook_only=("partly: what the scheduler itself may add at bind (its own keys, for a portion container) needs the "
                  "old pod's fractions; the policies leave the scheduler's updates to the webhook"),
)
