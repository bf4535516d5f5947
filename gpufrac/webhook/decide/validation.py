"""What the validating webhook denies, on the final object after every mutating webhook has run.

Pure. No rule is named here: the values are judged by `resolve`, then the rules of each later phase of the catalog
(`rules.Phase`: who may write what, the webhook's own output, the rest on a pod with a fraction) are run in their
order (`rules.table.run`), each given the pod's `PodReview`; pods/status and a Binding get their rules of their own.
"""

from __future__ import annotations

import functools
from typing import Any

from gpufrac.webhook.decide.errors import Violation
from gpufrac.webhook.decide.fractions import PodFractions
from gpufrac.webhook.decide.policy import Policy, UserInfo
from gpufrac.webhook.decide.resolve import resolve
from gpufrac.webhook.decide.rules.context import OwnRequest, PodReview
from gpufrac.webhook.decide.rules.rule import Phase, Scope
from gpufrac.webhook.decide.rules.table import run

_NO_FRACTIONS = PodFractions({}, {})


def _review(obj: dict[str, Any], old: dict[str, Any] | None, user: UserInfo, policy: Policy,
            fractions: PodFractions, template: bool = False) -> PodReview:
    if old is None:
        return PodReview(obj, None, user, policy, fractions, lambda: _NO_FRACTIONS, template)
    before = old
    # Once, and only for a rule that asks (the scheduler adding a key it may not add).
    return PodReview(obj, old, user, policy, fractions, functools.cache(lambda: resolve(before, bound=True)[0]),
                     template)


def authorship(old: dict[str, Any] | None, new: dict[str, Any], user: UserInfo, policy: Policy) -> list[Violation]:
    """Who may write which fraction annotation, on CREATE (old None) or UPDATE."""
    return run(Phase.AUTHORSHIP, _review(new, old, user, policy, _NO_FRACTIONS))


def validate_pod(obj: dict[str, Any], old: dict[str, Any] | None, user: UserInfo, policy: Policy) -> list[Violation]:
    """Every rule for a pod being created (old is None) or updated."""
    fractions, out = resolve(obj, bound=old is not None, allow_multiple=policy.allow_multiple_fraction_containers)
    return out + _after_values(_review(obj, old, user, policy, fractions), bool(out))


def _after_values(review: PodReview, denied: bool) -> list[Violation]:
    who_wrote = run(Phase.AUTHORSHIP, review)
    # The webhook's own output only where nothing above is denied: otherwise the canonical values differ only as a
    # consequence of what is, and saying so too would bury the cause.
    output = [] if denied or who_wrote else run(Phase.OUTPUT, review)
    return output + who_wrote + run(Phase.FRACTIONAL, review)


def validate_template(template: dict[str, Any], policy: Policy) -> list[Violation]:
    """The rules a pod made from this template meets on CREATE before anything is injected: its values, the
    scheduler's keys (a controller creates these pods, never the scheduler), and the boundaries of a fraction."""
    fractions, out = resolve(template, bound=False, allow_multiple=policy.allow_multiple_fraction_containers)
    review = _review(template, None, UserInfo(""), policy, fractions, template=True)
    return out + run(Phase.AUTHORSHIP, review) + run(Phase.FRACTIONAL, review)


def validate_status(obj: dict[str, Any], old: dict[str, Any]) -> list[Violation]:
    """pods/status: the rules of its own (`Scope.STATUS`)."""
    return run(Phase.OWN, OwnRequest(obj, old), scopes=(Scope.STATUS,))


def validate_binding(binding: dict[str, Any]) -> list[Violation]:
    """A Binding: the rules of its own (`Scope.BINDING`)."""
    return run(Phase.OWN, OwnRequest(binding), scopes=(Scope.BINDING,))
