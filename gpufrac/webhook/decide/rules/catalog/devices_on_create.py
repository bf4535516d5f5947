"""The rule `devicesOnCreate`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.webhook.decide import pod as podview
from gpufrac.webhook.decide.cel import annotation_message, when
from gpufrac.webhook.decide.errors import Violation, annotation
from gpufrac.webhook.decide.policy import Policy, UserInfo
from gpufrac.webhook.decide.rules.context import PodReview
from gpufrac.webhook.decide.rules.parts import bind_only, is_bind_only, user_fraction_keys
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope


def cel() -> str:
    problem = "'is written by the scheduler at bind (' + variables.schedulerNames + '), not on create'"
    return when("oldObject == null && !variables.isScheduler",
                f"variables.prefixedKeys.filter(k, {bind_only('k')})"
                f".map(k, {annotation_message('k', 'variables.anns[k]', problem)})")


def scheduler_names(policy: Policy) -> str:
    names = sorted(policy.scheduler_users) + [f"group {g}" for g in sorted(policy.scheduler_groups)]
    return ", ".join(names) or "no identity (none configured)"


def authorship_on_create(new_keys: dict[str, str], user: UserInfo, policy: Policy) -> list[Violation]:
    """Only the scheduler writes its bind-time keys, and it never creates pods."""
    if policy.is_scheduler(user):
        return []
    return [annotation(key, value, f"is written by the scheduler at bind ({scheduler_names(policy)}), not on create")
            for key, value in new_keys.items() if is_bind_only(key)]


def check(review: PodReview) -> list[Violation]:
    if review.old is not None:
        return []
    return authorship_on_create(user_fraction_keys(podview.annotations(review.obj)), review.user, review.policy)


RULE = Rule(
    "devicesOnCreate", "gpus.devices is written by the scheduler only, at bind",
    Scope.CREATE, Phase.AUTHORSHIP, 240,
    check,
    cel(),
)
