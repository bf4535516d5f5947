"""The rule `devicesFollowRequest`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.cel import annotation_message
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    DEV,
    REQ,
    devices_problem,
    field_key,
)
from gpufrac.webhook.decide.rules.variables import (
    has_memory,
    is_written,
)


def cel() -> str:
    devices = f"variables.anns[{field_key('c', DEV)}]"
    listed = f"{devices}.split(',').map(d, d.trim())"
    key = field_key("c", DEV)
    shown = f"{listed}.join(',')"
    valid = f"{is_written('c', DEV)} && {devices_problem(devices)} == ''"
    no_memory = (f"'assigns devices to container ' + c + ', whose portion request has no memory in MiB yet: the "
                 f"scheduler writes ' + {field_key('c', REQ)} + ' (and .limit) in the same update, or the "
                 "container would start without a memory limit'")
    count = (f"'lists ' + string(size({listed})) + ' devices, but the pod asks for ' + string(variables.numDevices) "
             f"+ ' ({ann.NUM_DEVICES})'")
    # The cheap tests first: the value's own check (splitting and matching every entry) only where they fail.
    return (f"variables.fractional.filter(c, !{has_memory('c')} && {valid})"
            f".map(c, {annotation_message(key, shown, no_memory)}) + "
            f"variables.fractional.filter(c, {is_written('c', DEV)} && size({listed}) != variables.numDevices && "
            f"{valid})"
            f".map(c, {annotation_message(key, shown, count)})")


RULE = Rule(
    "devicesFollowRequest", "devices come with memory, one per requested device",
    Scope.POD, Phase.VALUE, 220,
    (fr.rule_devices_follow_the_request,),
    cel(),
)
