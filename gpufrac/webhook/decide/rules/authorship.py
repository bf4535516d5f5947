"""The CEL of who may write what (`validation._authorship`, `validate_status`, `validate_binding`) and of the
webhook's own output (`validation._webhook_output`)."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import CanonicalField, ComputeMode
from gpufrac.core.contract import (
    FRACTIONAL_LABEL,
    FRACTIONAL_VALUE,
    NO_COMPUTE_CAP,
)
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide import validation as va
from gpufrac.webhook.decide.cel import annotation_message, cat, lit, one, str_list, when
from gpufrac.webhook.decide.rules.values import (
    CPORTION,
    KAI,
    LIM,
    NV,
    REQ,
    compute_portion_problem,
    field_key,
)
from gpufrac.webhook.decide.rules.variables import (
    at_container,
    canonical_key,
    has_memory,
    mode_of,
)


def _same_label(before: str, after: str) -> str:
    """CEL: the fractional label is the same in two label maps (absent in both, or equal)."""
    key = lit(FRACTIONAL_LABEL)
    return f"(({key} in {before}) == ({key} in {after}) && (!({key} in {before}) || {before}[{key}] == {after}[{key}]))"


def _user_keys(anns: str) -> str:
    """`validation.user_fraction_keys`: the fraction annotations but the webhook's own, as a list of keys."""
    return (f"{anns}.filter(k, (k in {str_list(ann.SHORTHAND_KEYS)} || k.startsWith({lit(NV)}) || "
            f"k.startsWith({lit(KAI)})))")


def cel_devices_on_create() -> str:
    problem = "'is written by the scheduler at bind (' + variables.schedulerNames + '), not on create'"
    return when("oldObject == null && !variables.isScheduler",
                f"{_user_keys('variables.anns')}.filter(k, {_bind_only('k')})"
                f".map(k, {annotation_message('k', 'variables.anns[k]', problem)})")


def _bind_only(k: str) -> str:
    """`validation._bind_only`: keys only the scheduler ever writes."""
    ends = " || ".join(f"{k}.endsWith({lit('.' + f)})" for f in ann.BIND_ONLY_FIELDS)
    return f"({k}.startsWith({lit(NV)}) && ({ends}))"


def cel_immutable() -> str:
    """`validation._authorship` on UPDATE, for everyone but the scheduler adding keys (its bind)."""
    old = "oldObject.metadata.?annotations.orValue({})"
    new, immutable = "variables.anns", lit("; " + va.IMMUTABLE)
    user = "(request.userInfo.username != '' ? request.userInfo.username : 'this user')"
    bind_shape = (f"({_bind_only('k')} || (k.startsWith({lit(NV)}) && (k.endsWith({lit('.' + REQ)}) || "
                  f"k.endsWith({lit('.' + LIM)}))))")
    why = f"({bind_shape} ? 'only the scheduler may add it, at bind' : {lit(va.IMMUTABLE)})"
    removed_message = annotation_message("k", f"{old}[k]", cat("'was removed'", immutable))
    changed_message = annotation_message("k", f"{new}[k]", cat("'was changed from '", f"{old}[k]", immutable))
    added_message = annotation_message("k", f"{new}[k]", cat("'cannot be added by '", user, "': '", why))
    removed = f"{_user_keys(old)}.filter(k, !(k in {new})).map(k, {removed_message})"
    changed = f"{_user_keys(new)}.filter(k, k in {old} && {old}[k] != {new}[k]).map(k, {changed_message})"
    added = when("!variables.isScheduler", f"{_user_keys(new)}.filter(k, !(k in {old})).map(k, {added_message})")
    label = "oldObject.metadata.?labels.orValue({})"
    relabel = when(f"{lit(FRACTIONAL_LABEL)} in {label} && !({_same_label(label, 'variables.labels')})",
                   one(lit(f"label {FRACTIONAL_LABEL}: is set by gpufrac and cannot be changed or removed")))
    return when("oldObject != null", f"{removed} + {changed} + {added} + {relabel}")


def _active_thread_percent(c: str) -> str:
    """`mutation._active_thread_percent` of an sm-sharing container: its compute portion as a floored percentage,
    at least 1; 100 (`NO_COMPUTE_CAP`) until the scheduler writes one."""
    v = f"variables.anns[{field_key(c, CPORTION)}]"
    percent = f"int(double({v}) * 100.0)"
    return (f"(({field_key(c, CPORTION)}) in variables.anns && {compute_portion_problem(v)} == '' ? "
            f"string({percent} < 1 ? 1 : {percent}) : {lit(str(NO_COMPUTE_CAP))})")


def cel_webhook_output() -> str:
    """`validation._webhook_output`, asked only when nothing above is denied (as the webhook does)."""
    expected = {
        CanonicalField.COMPUTE_MODE: ("true", mode_of("c")),
        CanonicalField.REQUEST_MIB: (has_memory("c"), f"string({at_container('requestMib', 'c')})"),
        CanonicalField.LIMIT_MIB: (has_memory("c"), f"string({at_container('limitMib', 'c')})"),
        CanonicalField.MPS_PINNED_MEM_LIMIT: (
            has_memory("c"),
            f"{list(range(fr.MAX_DEVICES))}.filter(i, i < variables.numDevices)"
            f".map(i, string(i) + '=' + string({at_container('limitMib', 'c')}) + 'M').join(',')"),
        CanonicalField.ACTIVE_THREAD_PERCENT: (f"{mode_of('c')} == {lit(str(ComputeMode.SM_SHARING))}",
                                               _active_thread_percent("c")),
    }
    parts = []
    for field, (needed, value) in expected.items():
        key = canonical_key("c", field)
        actual = f"variables.anns[{key}]"
        must = cat("'must be '", value, "', as gpufrac computes it from the fraction annotations'")
        written = " (only the gpufrac webhook writes them)"
        wrong = annotation_message(key, actual, cat(must, lit(written)))
        missing = annotation_message(key, None, cat(must, lit(", but it is missing" + written)))
        parts.append(f"variables.fractional.filter(c, {needed} && ({key}) in variables.anns && {actual} != {value})"
                     f".map(c, {wrong})")
        parts.append(f"variables.fractional.filter(c, {needed} && !(({key}) in variables.anns)).map(c, {missing})")
    expected_key = " || ".join(f"(({needed}) && k == {canonical_key('c', field)})"
                               for field, (needed, _) in expected.items())
    stray = annotation_message("k", "variables.anns[k]", lit("is not one gpufrac writes for this pod; remove it"))
    parts.append(f"variables.anns.filter(k, k.startsWith({lit(ann.GPUFRAC_DOMAIN)}) && "
                 f"!variables.fractional.exists(c, {expected_key})).map(k, {stray})")
    label = f"variables.labels[?{lit(FRACTIONAL_LABEL)}].orValue('')"
    parts.append(when(f"size(variables.fractional) > 0 && !({lit(FRACTIONAL_LABEL)} in variables.labels && "
                      f"{label} == {lit(FRACTIONAL_VALUE)})",
                      one(lit(f"label {FRACTIONAL_LABEL}: must be {FRACTIONAL_VALUE} on a pod with GPU fractions "
                              "(the node agent finds them by it); it is set by the gpufrac mutating webhook"))))
    parts.append(when(f"size(variables.fractional) == 0 && {lit(FRACTIONAL_LABEL)} in variables.labels",
                      one(lit(f"label {FRACTIONAL_LABEL}: is only for pods with GPU fractions; remove it"))))
    return " + ".join(parts)


def cel_status() -> str:
    old, new = "oldObject.metadata.?annotations.orValue({})", "variables.anns"
    fraction_key = (f"(k in {str_list(ann.SHORTHAND_KEYS)} || k.startsWith({lit(NV)}) || k.startsWith({lit(KAI)}) "
                    f"|| k.startsWith({lit(ann.GPUFRAC_DOMAIN)}))")
    problem = lit("cannot be changed through pods/status")
    label_old = "oldObject.metadata.?labels.orValue({})"
    changed = annotation_message("k", f"{new}[k]", problem)
    removed = annotation_message("k", f"{old}[k]", problem)
    return (f"{new}.filter(k, {fraction_key} && (!(k in {old}) || {old}[k] != {new}[k])).map(k, {changed}) + "
            f"{old}.filter(k, {fraction_key} && !(k in {new})).map(k, {removed}) + "
            + when(f"!({_same_label(label_old, 'variables.labels')})",
                   one(lit(f"label {FRACTIONAL_LABEL}: cannot be changed through pods/status"))))


def cel_binding() -> str:
    fraction_key = (f"(k in {str_list(ann.SHORTHAND_KEYS)} || k.startsWith({lit(NV)}) || k.startsWith({lit(KAI)}) "
                    f"|| k.startsWith({lit(ann.GPUFRAC_DOMAIN)}))")
    problem = lit("cannot be set through a Binding (it would skip the gpufrac checks); set it on the pod before "
                  "binding")
    return (f"variables.anns.filter(k, {fraction_key})"
            f".map(k, {annotation_message('k', 'variables.anns[k]', problem)})")
