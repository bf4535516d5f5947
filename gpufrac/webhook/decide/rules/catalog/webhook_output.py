"""The rule `webhookOutput`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from typing import Any

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import CanonicalField, ComputeMode
from gpufrac.core.contract import (
    FRACTIONAL_LABEL,
    FRACTIONAL_VALUE,
)
from gpufrac.webhook.decide import pod as podview
from gpufrac.webhook.decide.cel import annotation_message, cat, lit, one, when
from gpufrac.webhook.decide.errors import Violation, annotation
from gpufrac.webhook.decide.fractions import PodFractions
from gpufrac.webhook.decide.mutation import canonical_annotations
from gpufrac.webhook.decide.rules.context import PodReview
from gpufrac.webhook.decide.rules.parts import active_thread_percent
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import OURS
from gpufrac.webhook.decide.rules.variables import (
    at_container,
    canonical_key,
    has_memory,
    mode_of,
)


def _expected(c: str) -> dict[CanonicalField, tuple[str, str]]:
    """For container `c` (a CEL expression): each canonical field, when it is written, and its value."""
    return {
        CanonicalField.COMPUTE_MODE: ("true", mode_of(c)),
        CanonicalField.REQUEST_MIB: (has_memory(c), f"string({at_container('requestMib', c)})"),
        CanonicalField.LIMIT_MIB: (has_memory(c), f"string({at_container('limitMib', c)})"),
        CanonicalField.MPS_PINNED_MEM_LIMIT: (
            has_memory(c),
            f"variables.deviceIndexes.map(i, string(i) + '=' + string({at_container('limitMib', c)}) + 'M')"
            ".join(',')"),
        CanonicalField.ACTIVE_THREAD_PERCENT: (f"{mode_of(c)} == {lit(str(ComputeMode.SM_SHARING))}",
                                               active_thread_percent(c)),
    }


def _stray() -> str:
    """CEL over k, one of gpufrac's keys: it is none the pod needs. The key is read as `<prefix><c>.<field>` (a
    container's name has no dot) instead of every expected key being spelled out for every container."""
    start = len(OURS)
    dot = f"k.indexOf('.', {start})"
    name, field = f"k.substring({start}, {dot})", f"k.substring({dot} + 1)"
    expected = " || ".join(f"({field} == {lit(str(f))} && ({needed}))" for f, (needed, _) in _expected(name).items())
    return (f"!(k.startsWith({lit(OURS)}) && {dot} > {start} && {name} in variables.fractional && "
            f"({expected}))")


def cel() -> str:
    """`webhook_output`, asked only when nothing above is denied (as the webhook does)."""
    parts = []
    for field, (needed, value) in _expected("c").items():
        key = canonical_key("c", field)
        actual = f"variables.anns[{key}]"
        must = cat("'must be '", value, "', as gpufrac computes it from the fraction annotations'")
        written = " (only the gpufrac webhook writes them)"
        wrong = annotation_message(key, actual, cat(must, lit(written)))
        missing = annotation_message(key, None, cat(must, lit(", but it is missing" + written)))
        # One pass per field: a missing key reads as '' (never a value gpufrac writes), and the message says which.
        parts.append(f"variables.fractional.filter(c, {needed} && variables.anns[?{key}].orValue('') != {value})"
                     f".map(c, ({key}) in variables.anns ? {wrong} : {missing})")
    stray = annotation_message("k", "variables.anns[k]", lit("is not one gpufrac writes for this pod; remove it"))
    parts.append(f"variables.prefixedKeys.filter(k, k.startsWith({lit(ann.GPUFRAC_DOMAIN)}) && {_stray()})"
                 f".map(k, {stray})")
    label = f"variables.labels[?{lit(FRACTIONAL_LABEL)}].orValue('')"
    parts.append(when(f"size(variables.fractional) > 0 && !({lit(FRACTIONAL_LABEL)} in variables.labels && "
                      f"{label} == {lit(FRACTIONAL_VALUE)})",
                      one(lit(f"label {FRACTIONAL_LABEL}: must be {FRACTIONAL_VALUE} on a pod with GPU fractions "
                              "(the node agent finds them by it); it is set by the gpufrac mutating webhook"))))
    parts.append(when(f"size(variables.fractional) == 0 && {lit(FRACTIONAL_LABEL)} in variables.labels",
                      one(lit(f"label {FRACTIONAL_LABEL}: is only for pods with GPU fractions; remove it"))))
    return " + ".join(parts)


def webhook_output(obj: dict[str, Any], fractions: PodFractions) -> list[Violation]:
    """The `gpufrac.io/` annotations and label must be exactly what the webhook derives from the fraction keys."""
    out: list[Violation] = []
    expected = canonical_annotations(fractions)
    actual = {k: v for k, v in podview.annotations(obj).items() if k.startswith(ann.GPUFRAC_DOMAIN)}
    for key in sorted(expected.keys() | actual.keys()):
        if actual.get(key) == expected.get(key):
            continue
        if key not in expected:
            out.append(annotation(key, actual[key], "is not one gpufrac writes for this pod; remove it"))
        else:
            problem = f"must be {expected[key]}, as gpufrac computes it from the fraction annotations"
            if key not in actual:
                problem += ", but it is missing"
            out.append(annotation(key, actual.get(key), problem + " (only the gpufrac webhook writes them)"))
    label = podview.labels(obj).get(FRACTIONAL_LABEL)
    if fractions.is_fractional and label != FRACTIONAL_VALUE:
        out.append(Violation(f"label {FRACTIONAL_LABEL}", f"must be {FRACTIONAL_VALUE} on a pod with GPU fractions "
                             "(the node agent finds them by it); it is set by the gpufrac mutating webhook"))
    elif not fractions.is_fractional and label is not None:
        out.append(Violation(f"label {FRACTIONAL_LABEL}", "is only for pods with GPU fractions; remove it"))
    return out


def check(review: PodReview) -> list[Violation]:
    """Not on a workload's template, which nothing has written into yet."""
    return [] if review.template else webhook_output(review.obj, review.fractions)


RULE = Rule(
    "webhookOutput", "the canonical annotations and the label are exactly what gpufrac derives",
    Scope.POD, Phase.OUTPUT, 260,
    check,
    cel(),
)
