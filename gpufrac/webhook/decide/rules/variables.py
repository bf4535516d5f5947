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

_FEW_DEVICES = 8
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


def _written_or_translated(c: str, field: str) -> str:
    """The field's text for container `c` of variables.entries, written or translated (`fractions.merged_keys`:
    written wins), '' when it has none: the annotation read once (an optional lookup) instead of tested, then read."""
    translated = (f"({c} == variables.target && {TRANSLATED_OK[field]} ? {translated_value(field)} : '')"
                  if field in TRANSLATED_OK else "''")
    return f"({c} in variables.entries ? variables.anns[?{field_key(c, field)}].orValue({translated}) : '')"


def _valid_amounts(field: str) -> str:
    """Per container, in the order of variables.names: the field's text where it is a valid amount
    (`fractions.read_amount`), else ''. Each container's text is read once, then checked."""
    return (f"variables.names.map(c, {_written_or_translated('c', field)})"
            f".map(v, v != '' && {amount_ok('v')} ? v : '')")


def _mib_or_zero(text: str) -> str:
    """Per container: the MiB of a valid amount of `text` (a per-container list variable), 0 for none."""
    return f"variables.{text}.map(v, v == '' ? 0 : {mib_ceil('v')})"


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
    ("oldAnns", "oldObject == null ? {} : oldObject.metadata.?annotations.orValue({})"),
    ("regular", "object.spec.containers.map(c, c.name)"),
    ("names", "variables.regular + object.spec.?initContainers.orValue([]).map(c, c.name)"),
    ("listing", "size(variables.names) == 0 ? 'no containers' : "
                f"{list(range(fr.LISTED_CONTAINERS))}.filter(i, i < size(variables.names))"
                ".map(i, variables.names[i]).join(', ') + (size(variables.names) > "
                f"{fr.LISTED_CONTAINERS} ? ' and ' + string(size(variables.names) - {fr.LISTED_CONTAINERS}) + "
                "' more' : '')"),
    # The annotations under the per-container prefixes and gpufrac's domain: the only keys the rules iterate (a pod's
    # other annotations are looked at once, here).
    ("prefixedKeys", f"variables.anns.filter(k, k.startsWith({lit(NV)}) || k.startsWith({lit(KAI)}) || "
                     f"k.startsWith({lit(ann.GPUFRAC_DOMAIN)}))"),
    # `parts.user_fraction_keys` (parts.user_keys) of the object: the fraction annotations but the webhook's own.
    ("userKeys", f"variables.prefixedKeys.filter(k, !k.startsWith({lit(ann.GPUFRAC_DOMAIN)})) + "
                 f"{str_list(ann.SHORTHAND_KEYS)}.filter(s, s in variables.anns)"),
    # The per-container keys users and the scheduler write that `fractions.read_container_keys` keeps.
    ("keys", f"variables.prefixedKeys.filter(k, (k.matches({regex(well_formed(NV))}) || "
             f"k.matches({regex(well_formed(KAI))})) && {container_of('k')} in variables.names)"),
    # The container each of variables.keys names, in the same order: read once per key.
    ("keyOwners", f"variables.keys.map(k, {container_of('k')})"),
    # `fractions.keyed_container`: the containers the nvidia.com/container. keys name.
    ("keyed", f"variables.names.filter(c, variables.keys.exists(k, k.startsWith({lit(NV)} + c + '.')))"),
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
    # The device indexes of the MPS pinned-memory limit (`mutation._pinned_limit`), made once.
    # A short list when the pod asks for a few devices, as it nearly always does (a literal list is made whole).
    ("deviceIndexes", f"(variables.numDevices <= {_FEW_DEVICES} ? {list(range(_FEW_DEVICES))} : "
                      f"{list(range(fr.MAX_DEVICES))}).filter(i, i < variables.numDevices)"),
    ("targeting", f"{str_list(fr.TARGETING)}.filter(s, s in variables.anns)"),
    # The containers any kept key names, in name order (as the webhook lists them).
    ("keyedListing", "variables.names.filter(n, n in variables.keyOwners).map(n, n).join(', ')"),
    ("offTarget", "size(variables.targeting) > 0 && variables.target != '' && "
                  "variables.keyOwners.exists(o, o != variables.target)"),
    ("ownKeys", f"variables.offTarget ? variables.keys.filter(k, {container_of('k')} == variables.target) : "
                "variables.keys"),
    # The containers with keys, written or translated (`fractions.merged_keys`).
    ("entries", "variables.names.filter(c, (c in variables.keyOwners && (!variables.offTarget || "
                "c == variables.target)) || "
                "(c == variables.target && (variables.memoryOk || variables.memoryLimitOk || "
                "variables.fractionLimitOk || variables.modeOk)))"),
    # `fractions.build_fractions`: the containers that hold a fraction, in the pod's order.
    ("translatedRequest", f"variables.memoryOk ? {mebibytes(f'int({a(ann.MEMORY)})')} : ''"),
    # Per container, in the order of variables.names: the valid request and limit as written or translated ('' for
    # none), each one's MiB (`fractions._memory`: each defaults to the other), the mode.
    ("requestText", _valid_amounts(REQ)),
    ("limitText", _valid_amounts(LIM)),
    # Each one's MiB, computed once per container; the other's where one is missing (`fractions._memory`).
    ("requestOwnMib", _mib_or_zero("requestText")),
    ("limitOwnMib", _mib_or_zero("limitText")),
    ("requestMib", f"variables.names.map(c, {at_container('requestOwnMib', 'c')} != 0 ? "
                   f"{at_container('requestOwnMib', 'c')} : {at_container('limitOwnMib', 'c')})"),
    ("limitMib", f"variables.names.map(c, {at_container('limitOwnMib', 'c')} != 0 ? "
                 f"{at_container('limitOwnMib', 'c')} : {at_container('requestOwnMib', 'c')})"),
    ("modeOf", f"variables.names.map(c, {_written_or_translated('c', MODE)})"
               f".map(m, m in {str_list(MODES)} ? m : {lit(str(ann.DEFAULT_MODE))})"),
    # `fractions.build_fractions`: the containers that hold a fraction, in the pod's order.
    ("fractional", "variables.names.filter(c, (c == variables.target && variables.fractionOk) || "
                   f"{has_memory('c')})"),
    # Each fractional container's mode, in the order of variables.fractional.
    ("fractionalModes", f"variables.fractional.map(c, {mode_of('c')})"),
    ("isScheduler", "request.userInfo.username in variables.schedulerUsers || "
                    "(has(request.userInfo.groups) && "
                    "request.userInfo.groups.exists(g, g in variables.schedulerGroups))"),
)


# Settings the chart passes (helm) or `gpufrac policies` is given: name -> (CEL for the defaults, helm template).
SETTINGS = ("schedulerUsers", "schedulerGroups", "schedulerNames", "allowMultiple", "mpsRoot", "csiDriver",
            "csiDelivery")


def per_key(select: str, problem: Callable[[str], str], show_value: bool = True,
            keys: str = "variables.prefixedKeys") -> str:
    """Messages for each annotation `k` of `keys` (a list variable of annotation keys: the fraction keys, never all
    annotations) that `select` (CEL over k) picks and whose value has a problem."""
    v = "variables.anns[k]"
    return (f"{keys}.filter(k, {select} && {problem(v)} != '')"
            f".map(k, {annotation_message('k', v if show_value else None, problem(v))})")


def own_field(field: str) -> str:
    """CEL over k, one of variables.ownKeys (`per_key`'s keys): k is a kept key of `field` whose problems are its own
    (not one translated: `fractions.read_container_request` reports those as their shorthand)."""
    translated = (f" && !({container_of('k')} == variables.target && {TRANSLATED_OK[field]})"
                  if field in TRANSLATED_OK else "")
    return f"(k.endsWith({lit('.' + field)}){translated})"
