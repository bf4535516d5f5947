"""The CEL of the rules on a pod's fraction values (`fractions.rules`): keys, targets, translations, requests
and the fractions they make."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.core.contract import (
    MIB,
)
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.cel import ann as a
from gpufrac.webhook.decide.cel import annotation_message, cat, has_ann, lit, one, regex, when
from gpufrac.webhook.decide.rules.values import (
    CPORTION,
    DEV,
    KAI,
    LIM,
    MODE,
    NV,
    OURS,
    PORTION,
    REQ,
    amount_problem,
    compute_portion_problem,
    container_of,
    devices_problem,
    field_key,
    mode_value_problem,
    number_ok,
    portion_limit_problem,
    quantity_ok,
    well_formed,
)
from gpufrac.webhook.decide.rules.variables import (
    TRANSLATED_OK,
    at_container,
    field_value,
    has_field,
    has_memory,
    has_portion_limit,
    is_written,
    mode_of,
    own_field,
    per_key,
    translated_value,
)


def cel_malformed() -> str:
    cases = []
    for prefix in (NV, KAI, OURS):
        accepted = ann.MalformedKeyError(prefix, ann.accepted_keys(prefix)).accepted
        cases.append((f"k.startsWith({lit(prefix)}) && !k.matches({regex(well_formed(prefix))})", accepted))
    other = ann.MalformedKeyError(ann.GPUFRAC_DOMAIN, ann.accepted_keys(ann.GPUFRAC_DOMAIN)).accepted
    select = " || ".join(f"({c})" for c, _ in cases) + f" || (k.startsWith({lit(ann.GPUFRAC_DOMAIN)}) && " \
                                                       f"!k.startsWith({lit(OURS)}))"
    accepted = lit(other)
    for condition, text in reversed(cases):
        accepted = f"({condition} ? {lit(text)} : {accepted})"
    message = f"'annotation ' + k + ': is not a key gpufrac knows: ' + {accepted}"
    return f"variables.anns.filter(k, {select}).map(k, {message})"


def cel_unknown_container() -> str:
    kept = f"(k.matches({regex(well_formed(NV))}) || k.matches({regex(well_formed(KAI))}))"
    return (f"variables.anns.filter(k, {kept} && !({container_of('k')} in variables.names))"
            f".map(k, 'annotation ' + k + ': names container ' + {container_of('k')} + ', but the pod has ' + "
            "variables.listing)")


def cel_target() -> str:
    v = a(ann.CONTAINER_NAME)
    return when(f"{has_ann(ann.CONTAINER_NAME)} && !({v} in variables.names)",
                one(annotation_message(lit(ann.CONTAINER_NAME), v,
                                       "'must name a container of the pod: ' + variables.listing")))


def cel_fraction_or_memory() -> str:
    problem = f"cannot be used together with {ann.FRACTION}: ask for a portion or for an amount of memory, not both"
    return when(f"{has_ann(ann.FRACTION)} && {has_ann(ann.MEMORY)}",
                one(annotation_message(lit(ann.MEMORY), a(ann.MEMORY), lit(problem))))


def cel_portion_without_absolute_memory() -> str:
    problem = (f"cannot be used together with {ann.FRACTION}: the scheduler writes absolute memory for portion "
               "requests at bind")
    return when(f"oldObject == null && {has_ann(ann.FRACTION)}",
                per_key(f"k in variables.keys && (k.endsWith({lit('.' + REQ)}) || k.endsWith({lit('.' + LIM)}))",
                        lambda _: lit(problem)))


def cel_container_limit_needs_memory_limit() -> str:
    problem = (f"cannot be used together with {ann.MEMORY} alone: write the limit as {ann.MEMORY_LIMIT}, or write "
               "both request and limit per container")
    return when(f"{has_ann(ann.MEMORY)} && !{has_ann(ann.MEMORY_LIMIT)}",
                per_key(f"k in variables.keys && k.endsWith({lit('.' + LIM)})", lambda _: lit(problem)))


def cel_num_devices_need_a_fraction() -> str:
    problem = (f"needs a fraction to apply to: {ann.FRACTION}, {ann.MEMORY} or "
               "nvidia.com/container.<c>.gpu-memory.request")
    memory_keys = f"variables.keys.exists(k, k.endsWith({lit('.' + REQ)}) || k.endsWith({lit('.' + LIM)}))"
    return when(f"{has_ann(ann.NUM_DEVICES)} && !{has_ann(ann.FRACTION)} && !{has_ann(ann.MEMORY)} && "
                f"!{memory_keys}", one(annotation_message(lit(ann.NUM_DEVICES), a(ann.NUM_DEVICES), lit(problem))))


def cel_keys_name_the_target() -> str:
    c = container_of("k")
    explicit = (f"'names container ' + {c} + ', but {ann.CONTAINER_NAME} is ' + variables.target + "
                "'; the fraction annotations of a pod name one container'")
    implied = (f"'names container ' + {c} + ', but ' + variables.targeting[0] + ' applies to ' + variables.target + "
               f"'; set {ann.CONTAINER_NAME} to ' + {c}")
    keyed = f"variables.names.filter(n, variables.keys.exists(k, {container_of('k')} == n))"
    several = (f"'names container ' + {c} + ', but the fraction annotations of this pod name ' + "
               f"variables.keyedListing + '; they name one container, which ' + variables.targeting[0] + "
               "' applies to'")
    implied = f"(size(variables.keyed) != 1 && size({keyed}) > 1 ? {several} : {implied})"
    problem = f"({has_ann(ann.CONTAINER_NAME)} ? {explicit} : {implied})"
    message = annotation_message("k", "variables.anns[k]", problem)
    return when("variables.offTarget", f"variables.keys.filter(k, {c} != variables.target).map(k, {message})")


def cel_portion_limit_names_the_first_container() -> str:
    """`fractions.rule_portion_limit_names_the_first_container`: without gpu-fraction-container-name, a portion limit
    on a container the keys name, other than the first."""
    t = "variables.target"
    problem = cat(lit("applies to container "), t, lit(f", which the {ann.NVIDIA_PREFIX}"), t,
                  lit(".* annotations name, but KAI reads a portion limit as the first container's ("),
                  "variables.regular[0]", lit(f") unless {ann.CONTAINER_NAME} says otherwise: set "
                                              f"{ann.CONTAINER_NAME} to "), t)
    key = f"({has_ann(ann.FRACTION_LIMIT)} ? {lit(ann.FRACTION_LIMIT)} : {field_key(t, PORTION)})"
    return when(f"!{has_ann(ann.CONTAINER_NAME)} && {t} != '' && size(variables.regular) > 0 && "
                f"{t} != variables.regular[0] && {t} in variables.entries && {has_field(t, PORTION)}",
                one(annotation_message(key, field_value(t, PORTION), problem)))


def cel_translation_agrees() -> str:
    """`fractions.rule_translation_agrees`: the target's written keys say what their shorthands say."""
    out = []
    t = "variables.target"
    for field, source in ((MODE, ann.COMPUTE_MODE), (LIM, ann.MEMORY_LIMIT), (REQ, ann.MEMORY),
                          (PORTION, ann.FRACTION_LIMIT)):
        key, wanted = field_key(t, field), translated_value(field)
        written = f"variables.anns[{key}]"
        if field in (REQ, LIM):
            same = f"({quantity_ok(written)} && quantity({written}).compareTo(quantity({wanted})) == 0)"
        elif field == PORTION:
            same = f"({number_ok(written)} && double({written}) == double({wanted}))"
        else:
            same = "false"
        reworded = lit(f"says what {source} says, written differently; KAI's admission compares the text and denies "
                       "it: write ")
        differs = (f"({same} ? {reworded} + {wanted} + ' or drop one of them' : "
                   f"{lit('does not match ' + source + ' (')} + {wanted} + '); write one of them')")
        out.append(when(f"{t} != '' && {TRANSLATED_OK[field]} && ({key}) in variables.anns && {written} != {wanted} "
                        f"&& !(oldObject != null && {same})",
                        one(annotation_message(key, written, differs))))
    # Sorted by field name, as the webhook does: gpu-compute.mode, gpu-memory.limit, gpu-memory.portion.limit
    # (KAI's prefix), gpu-memory.request.
    return " + ".join([out[0], out[1], out[3], out[2]])


def cel_container_values() -> str:
    parts = [
        per_key(own_field(REQ), amount_problem),
        per_key(own_field(LIM), amount_problem),
        per_key(own_field(MODE), mode_value_problem),
        per_key(own_field(DEV), devices_problem),
        per_key(own_field(PORTION), portion_limit_problem),
        per_key(own_field(CPORTION), compute_portion_problem),
    ]
    return " + ".join(parts)


def cel_request_within_limit() -> str:
    req, lim = at_container("requestText", "c"), at_container("limitText", "c")
    both = f"{req} != '' && {lim} != ''"
    q = f"quantity({req})"
    describe = (f"({q}.isInteger() && {q}.asInteger() % {MIB} == 0 ? string({q}.asInteger() / {MIB}) + ' MiB' : "
                f"{req})")
    problem = cat(lit("must not be smaller than the request ("), describe, lit(")"))
    message = annotation_message(field_key("c", LIM), lim, problem)
    return f"variables.entries.filter(c, {both} && quantity({lim}).isLessThan(quantity({req}))).map(c, {message})"


def cel_mode_and_devices_need_a_fraction() -> str:
    asks = (f"(c in variables.fractional || {has_field('c', REQ)} || {has_field('c', LIM)} || "
            f"({has_ann(ann.FRACTION)} && c == variables.target))")
    portion = (f"(c == variables.target ? {lit(ann.FRACTION)} : "
               f"{lit(ann.FRACTION + ' with ' + ann.CONTAINER_NAME + ': ')} + c)")
    mode_problem = (f"'needs a GPU memory request for container ' + c + ' (' + {field_key('c', REQ)} + ' or ' + "
                    f"{portion} + ')'")
    mode_key = field_key("c", MODE)
    mode_message = annotation_message(mode_key, f"variables.anns[{mode_key}]", mode_problem)
    out = (f"variables.entries.filter(c, !{asks} && {is_written('c', MODE)} && "
           f"!(c == variables.target && variables.modeOk)).map(c, {mode_message})")
    for bind_only in ann.BIND_ONLY_FIELDS:
        key = field_key("c", bind_only)
        message = annotation_message(key, f"variables.anns[{key}]",
                                     "'is set, but container ' + c + ' asks for no GPU fraction'")
        out += f" + variables.entries.filter(c, !{asks} && {is_written('c', bind_only)}).map(c, {message})"
    return out


def cel_one_fraction_container() -> str:
    return when("!variables.allowMultiple && size(variables.fractional) > 1",
                one("'pod: asks for GPU fractions in ' + string(size(variables.fractional)) + ' containers (' + "
                    "variables.fractional.join(', ') + \"); KAI's binder binds the fraction of one container per pod, "
                    "so this pod would never start: put the GPU work in one container, or in separate pods\""))


def cel_one_compute_mode() -> str:
    modes = f"variables.fractional.map(c, {mode_of('c')})"
    return when(f"{modes}.exists(m, m != {modes}[0])",
                one(f"'pod: mixes compute modes across containers (' + variables.fractional.map(c, c + '=' + "
                    f"{mode_of('c')}).join(', ') + \"); a pod's fractions share one mode, so set the same "
                    "gpu-compute.mode on each\""))


def cel_devices_follow_the_request() -> str:
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
    return (f"variables.fractional.filter(c, {valid} && !{has_memory('c')})"
            f".map(c, {annotation_message(key, shown, no_memory)}) + "
            f"variables.fractional.filter(c, {valid} && size({listed}) != variables.numDevices)"
            f".map(c, {annotation_message(key, shown, count)})")


def cel_name_fits_the_keys() -> str:
    out = [f"variables.fractional.filter(c, !c.matches({regex(ann.CONTAINER_NAME_PATTERN)}))"
           ".map(c, 'container ' + c + ': has a name that cannot be part of an annotation key (a lowercase DNS-1123 "
           "label is needed); rename it')"]
    for portion_limit in (False, True):
        position, rest = fr.longest_key(portion_limit)
        allowed = ann.KEY_NAME_MAX - rest
        sample = fr.keys_for_name("<c>", portion_limit)[position]
        before, _, after = sample.partition("<c>")
        has_limit = has_portion_limit("c")
        head = lit(f": has a name longer than {allowed} characters, too long for the annotation key {before}")
        tail = lit(f"{after} (at most {ann.KEY_NAME_MAX} characters after the /); shorten it")
        negate = "" if portion_limit else "!"
        out.append(f"variables.fractional.filter(c, c.matches({regex(ann.CONTAINER_NAME_PATTERN)}) && "
                   f"{negate}{has_limit} && size(c) > {allowed}).map(c, 'container ' + c + {head} + c + {tail})")
    return " + ".join(out)
