"""The rule `devicesOnCreate`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.webhook.decide import validation as va
from gpufrac.webhook.decide.cel import annotation_message, when
from gpufrac.webhook.decide.rules.parts import bind_only
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope


def cel() -> str:
    problem = "'is written by the scheduler at bind (' + variables.schedulerNames + '), not on create'"
    return when("oldObject == null && !variables.isScheduler",
                f"variables.prefixedKeys.filter(k, {bind_only('k')})"
                f".map(k, {annotation_message('k', 'variables.anns[k]', problem)})")


RULE = Rule(
    "devicesOnCreate", "gpus.devices is written by the scheduler only, at bind",
    Scope.CREATE, Phase.AUTHORSHIP, 240,
    (va.authorship, va.authorship_on_create),
    cel(),
)
