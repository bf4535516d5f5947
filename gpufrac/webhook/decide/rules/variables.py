"""The policies' variables: the per-container view, each container's fields once the shorthands are translated
(`fractions.merged_keys`), computed once per request and shared by the rules; and the settings the chart passes."""

from __future__ import annotations

from collections.abc import Callable

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import CanonicalField
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.cel import ann as a
from gpufrac.webhook.decide.cel import annotation_message, has_ann, lit, regex, str_list
from gpufrac.webhook.decide.rules.values import (
    KAI,
    LIM,
    MODE,
    MODES,
    NV,
    OURS,
    PORTION,
    REQ,
    amount_ok,
    container_of,
    field_key,
    fraction_problem,
    mebibytes,
    memory_limit_problem,
    memory_mib_problem,
    mib_ceil,
    mode_value_problem,
    num_devices_problem,
    portion_limit_problem,
    well_formed,
)

TRANSLATED_OK = {REQ: "variables.memoryOk", LIM: "variables.memoryLimitOk", PORTION: "variables.fractionLimitOk",
                 MODE: "variables.modeOk"}


def translated_value(field: str) -> str:
    return {REQ: "variables.translatedRequest", LIM: a(ann.MEMORY_LIMIT), PORTION: a(ann.FRACTION_LIMIT),
            MODE: a(ann.COMPUTE_MODE)}[field]


def is_written(c: str, field: str) -> str:
    return f"(({field_key(c, field)}) in variables.anns)"


def has_field(c: str, field: str) -> str:
    """Whether container `c` (one of variables.entries) has `field`, written or translated (`fractions.merged_keys`)."""
    translated = f" || ({c} == variables.target && {TRANSLATED_OK[field]})" if field in TRANSLATED_OK else ""
    return f"({is_written(c, field)}{translated})"


def field_value(c: str, field: str) -> str:
    """The field's text (written wins over translated), where `has_field` holds."""
    written = f"variables.anns[{field_key(c, field)}]"
    if field not in TRANSLATED_OK:
        return written
    return f"({is_written(c, field)} ? {written} : {translated_value(field)})"


def at_container(variable: str, c: str) -> str:
    """The entry for container `c` of a per-container variable (a list in the order of variables.names)."""
    return f"variables.{variable}[variables.names.indexOf({c})]"


def _valid_amount(c: str, field: str) -> str:
    """The field's text where it is a valid amount (`fractions.read_amount`), else ''."""
    value = field_value(c, field)
    return f"(c in variables.entries && {has_field(c, field)} && {amount_ok(value)} ? {value} : '')"


def has_memory(c: str) -> str:
    return f"({at_container('requestText', c)} != '' || {at_container('limitText', c)} != '')"


def mode_of(c: str) -> str:
    return at_container("modeOf", c)


def canonical_key(c: str, field: CanonicalField) -> str:
    return f"{lit(OURS)} + {c} + {lit('.' + str(field))}"


def has_portion_limit(c: str) -> str:
    return (f"({c} == variables.target && variables.fractionOk && {has_field(c, PORTION)} && "
            f"{portion_limit_problem(field_value(c, PORTION))} == '')")
VARIABLES: tuple[tuple[str, str], ...] = (
    ("anns", "object.metadata.?annotations.orValue({})"),
    ("labels", "object.metadata.?labels.orValue({})"),
    ("regular", "object.spec.containers.map(c, c.name)"),
    ("names", "variables.regular + object.spec.?initContainers.orValue([]).map(c, c.name)"),
    ("listing", "size(variables.names) == 0 ? 'no containers' : "
                f"{list(range(fr.LISTED_CONTAINERS))}.filter(i, i < size(variables.names))"
                ".map(i, variables.names[i]).join(', ') + (size(variables.names) > "
                f"{fr.LISTED_CONTAINERS} ? ' and ' + string(size(variables.names) - {fr.LISTED_CONTAINERS}) + "
                "' more' : '')"),
    # The per-container keys users and the scheduler write that `fractions.read_container_keys` keeps.
    ("keys", f"variables.anns.filter(k, (k.matches({regex(well_formed(NV))}) || "
             f"k.matches({regex(well_formed(KAI))})) && {container_of('k')} in variables.names)"),
    # `fractions.keyed_container`: the containers the nvidia.com/container. keys name.
    ("keyed", f"variables.names.filter(c, variables.keys.exists(k, k.startsWith({lit(NV)}) && "
              f"{container_of('k')} == c))"),
    ("target", f"{has_ann(ann.CONTAINER_NAME)} ? ({a(ann.CONTAINER_NAME)} in variables.names ? "
               f"{a(ann.CONTAINER_NAME)} : '') : size(variables.keyed) == 1 ? variables.keyed[0] : "
               "(size(variables.regular) > 0 ? variables.regular[0] : '')"),
    ("fractionOk", f"{has_ann(ann.FRACTION)} && {fraction_problem(a(ann.FRACTION))} == ''"),
    ("memoryOk", f"{has_ann(ann.MEMORY)} && {memory_mib_problem(a(ann.MEMORY))} == ''"),
    ("memoryLimitOk", f"{has_ann(ann.MEMORY_LIMIT)} && {memory_limit_problem(a(ann.MEMORY_LIMIT))} == ''"),
    ("fractionLimitOk", f"{has_ann(ann.FRACTION_LIMIT)} && {portion_limit_problem(a(ann.FRACTION_LIMIT))} == ''"),
    ("modeOk", f"{has_ann(ann.COMPUTE_MODE)} && {mode_value_problem(a(ann.COMPUTE_MODE))} == ''"),
    ("numDevices", f"{has_ann(ann.NUM_DEVICES)} && {num_devices_problem(a(ann.NUM_DEVICES))} == '' ? "
                   f"int({a(ann.NUM_DEVICES)}) : 1"),
    ("targeting", f"{str_list(fr.TARGETING)}.filter(s, s in variables.anns)"),
    # The containers any kept key names, in name order (as the webhook lists them).
    ("keyedListing", f"variables.names.filter(n, variables.keys.exists(k, {container_of('k')} == n))"
                     ".map(n, n).join(', ')"),
    ("offTarget", "size(variables.targeting) > 0 && variables.target != '' && "
                  f"variables.keys.exists(k, {container_of('k')} != variables.target)"),
    ("ownKeys", f"variables.offTarget ? variables.keys.filter(k, {container_of('k')} == variables.target) : "
                "variables.keys"),
    # The containers with keys, written or translated (`fractions.merged_keys`).
    ("entries", f"variables.names.filter(c, variables.ownKeys.exists(k, {container_of('k')} == c) || "
                "(c == variables.target && (variables.memoryOk || variables.memoryLimitOk || "
                "variables.fractionLimitOk || variables.modeOk)))"),
    # `fractions.build_fractions`: the containers that hold a fraction, in the pod's order.
    ("translatedRequest", f"variables.memoryOk ? {mebibytes(f'int({a(ann.MEMORY)})')} : ''"),
    # Per container, in the order of variables.names: the valid request and limit as written or translated ('' for
    # none), each one's MiB (`fractions._memory`: each defaults to the other), the mode.
    ("requestText", f"variables.names.map(c, {_valid_amount('c', REQ)})"),
    ("limitText", f"variables.names.map(c, {_valid_amount('c', LIM)})"),
    ("requestMib", f"variables.names.map(c, {at_container('requestText', 'c')} != '' ? "
                   f"{mib_ceil(at_container('requestText', 'c'))} : {at_container('limitText', 'c')} != '' ? "
                   f"{mib_ceil(at_container('limitText', 'c'))} : 0)"),
    ("limitMib", f"variables.names.map(c, {at_container('limitText', 'c')} != '' ? "
                 f"{mib_ceil(at_container('limitText', 'c'))} : {at_container('requestText', 'c')} != '' ? "
                 f"{mib_ceil(at_container('requestText', 'c'))} : 0)"),
    ("modeOf", f"variables.names.map(c, c in variables.entries && {has_field('c', MODE)} && "
               f"{field_value('c', MODE)} in {str_list(MODES)} ? {field_value('c', MODE)} : "
               f"{lit(str(ann.DEFAULT_MODE))})"),
    # `fractions.build_fractions`: the containers that hold a fraction, in the pod's order.
    ("fractional", "variables.names.filter(c, (c == variables.target && variables.fractionOk) || "
                   f"{has_memory('c')})"),
    ("isScheduler", "request.userInfo.username in variables.schedulerUsers || "
                    "(has(request.userInfo.groups) && "
                    "request.userInfo.groups.exists(g, g in variables.schedulerGroups))"),
)


# Settings the chart passes (helm) or `gpufrac policies` is given: name -> (CEL for the defaults, helm template).
SETTINGS = ("schedulerUsers", "schedulerGroups", "schedulerNames", "allowMultiple", "mpsRoot", "csiDriver",
            "csiDelivery")


def per_key(select: str, problem: Callable[[str], str], show_value: bool = True) -> str:
    """Messages for each annotation `k` that `select` (CEL over k) picks and whose value has a problem."""
    v = "variables.anns[k]"
    return (f"variables.anns.filter(k, {select} && {problem(v)} != '')"
            f".map(k, {annotation_message('k', v if show_value else None, problem(v))})")


def own_field(field: str) -> str:
    """CEL over k: k is a kept key of `field` whose problems are its own (not one translated: `fractions.
    read_container_request` reports those as their shorthand)."""
    translated = (f" && !({container_of('k')} == variables.target && {TRANSLATED_OK[field]})"
                  if field in TRANSLATED_OK else "")
    return f"(k in variables.ownKeys && k.endsWith({lit('.' + field)}){translated})"
