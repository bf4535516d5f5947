"""The rule `immutable`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core.contract import (
    FRACTIONAL_LABEL,
)
from gpufrac.webhook.decide import validation as va
from gpufrac.webhook.decide.cel import annotation_message, cat, lit, one, when
from gpufrac.webhook.decide.rules.parts import bind_only, same_label, user_keys
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    LIM,
    NV,
    REQ,
)


def cel() -> str:
    """`validation._authorship` on UPDATE, for everyone but the scheduler adding keys (its bind)."""
    old = "variables.oldAnns"
    new, immutable = "variables.anns", lit("; " + va.IMMUTABLE)
    user = "(request.userInfo.username != '' ? request.userInfo.username : 'this user')"
    bind_shape = (f"({bind_only('k')} || (k.startsWith({lit(NV)}) && (k.endsWith({lit('.' + REQ)}) || "
                  f"k.endsWith({lit('.' + LIM)}))))")
    why = f"({bind_shape} ? 'only the scheduler may add it, at bind' : {lit(va.IMMUTABLE)})"
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


RULE = Rule(
    "immutable", "fraction annotations and the label do not change after CREATE (but the scheduler's bind)",
    Scope.UPDATE, Phase.AUTHORSHIP, 250,
    (va.authorship, va.authorship_on_update),
    cel(),
    webhook_only=("partly: what the scheduler itself may add at bind (its own keys, for a portion container) needs the "
                  "old pod's fractions; the policies leave the scheduler's updates to the webhook"),
)
