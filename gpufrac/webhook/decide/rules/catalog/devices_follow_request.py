"""The rule `devicesFollowRequest`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import Field
from gpufrac.webhook.decide.cel import annotation_message
from gpufrac.webhook.decide.errors import Violation, annotation
from gpufrac.webhook.decide.rules.context import Values
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


def check(values: Values) -> list[Violation]:
    out = []
    for fraction in values.fractions.values():
        if not fraction.devices:
            continue
        name, key = fraction.container, ann.nvidia_key(fraction.container, Field.DEVICES)
        shown = ",".join(fraction.devices)
        if fraction.memory is None:
            out.append(annotation(key, shown, f"assigns devices to container {name}, whose portion request has no "
                                  f"memory in MiB yet: the scheduler writes "
                                  f"{ann.nvidia_key(name, Field.MEMORY_REQUEST)} (and .limit) in the same update, or "
                                  "the container would start without a memory limit"))
        if len(fraction.devices) != fraction.num_devices:
            out.append(annotation(key, shown, f"lists {len(fraction.devices)} devices, but the pod asks for "
                                              f"{fraction.num_devices} ({ann.NUM_DEVICES})"))
    return out


RULE = Rule(
    "devicesFollowRequest", "devices come with memory, one per requested device",
    Scope.POD, Phase.VALUE, 220,
    check,
    cel(),
    by_fraction=True,
)
