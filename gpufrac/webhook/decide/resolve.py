"""`resolve`: a pod's fraction annotations read (`fractions`), then judged by every value rule of the catalog
(`rules.table.run`, phase VALUE), from a pod's annotations to its fractions with every violation found; memoized by
the fraction annotations and container names.

Pure. No rule is named here: each value rule's module holds its check, and `Values` is what every check reads.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide import pod as podview
from gpufrac.webhook.decide.errors import Violation, show_value
from gpufrac.webhook.decide.fractions import (
    Containers,
    PodFractions,
    Shorthands,
    build_fractions,
    merged_keys,
    read_container_keys,
    read_container_request,
    read_containers,
    read_pod_request,
    read_shorthands,
    read_target,
    translate,
)
from gpufrac.webhook.decide.rules.context import Values
from gpufrac.webhook.decide.rules.rule import Phase
from gpufrac.webhook.decide.rules.table import run


def lone_compute_mode(shorthands: Shorthands, fractional: set[str]) -> str | None:
    """A pod-level compute mode on a pod with no fraction (a whole-GPU pod written for KAI, which ignores it): left
    as it is, with a warning instead of a denial."""
    text = shorthands.get(ann.COMPUTE_MODE)
    if text is None or fractional:
        return None
    return (f"annotation {ann.COMPUTE_MODE}: {show_value(text)} is ignored: the pod asks for no GPU fraction "
            f"({ann.FRACTION}, {ann.MEMORY} or nvidia.com/container.<c>.gpu-memory.request) for a compute mode to "
            "apply to (KAI ignores it too); the pod is left as it is")


# A pod's fractions depend only on its fraction annotations and its container names; pods made from one template
# (a Deployment's, a Job's), and the reviews of one pod, share them. Pods whose fraction annotations are longer
# than this are resolved afresh each time, so the memo holds at most _MEMO_PODS of this size.
_MEMO_TEXT = 4096
_MEMO_PODS = 256


def resolve(obj: dict[str, Any], *, bound: bool,
            allow_multiple: bool = False) -> tuple[PodFractions, list[Violation]]:
    """Read every fraction annotation of a pod into per-container requests, with every violation found.

    `bound`: whether absolute memory values next to `gpu-fraction` are the scheduler's bind-time values (an
    UPDATE after CREATE, whose authorship `validation` checks) rather than something the user wrote.
    `allow_multiple`: whether several containers of one pod may each hold a fraction (a binder that binds each).
    """
    annotations = podview.annotations(obj)
    containers = read_containers(obj)
    # Every other annotation is one `resolve` skips (no shorthand, not under a prefix it reads).
    written = tuple((k, v) for k, v in annotations.items() if ann.is_fraction_key(k))
    if sum(len(k) + len(v) for k, v in written) <= _MEMO_TEXT:
        fractions, found = _resolve_memo(written, containers, bound, allow_multiple)
        violations = list(found)
    else:
        fractions, violations = _resolve(dict(written), containers, bound, allow_multiple)
    # Copies: callers may add to what they get, the memo's stays as it was.
    return PodFractions(dict(fractions.containers), dict(fractions.translated), fractions.warnings), violations


@functools.lru_cache(maxsize=_MEMO_PODS)
def _resolve_memo(written: tuple[tuple[str, str], ...], containers: Containers, bound: bool,
                  allow_multiple: bool) -> tuple[PodFractions, tuple[Violation, ...]]:
    fractions, violations = _resolve(dict(written), containers, bound, allow_multiple)
    return fractions, tuple(violations)


def read_values(annotations: dict[str, str], containers: Containers, bound: bool,
                allow_multiple: bool) -> tuple[Values, dict[Callable[..., Any], list[Violation]]]:
    """Everything the value rules read, and what each reader found wrong on the way (`Rule.reads`)."""
    shorthands = read_shorthands(annotations)
    keys, key_problems = read_container_keys(annotations, containers)
    target, target_problems = read_target(shorthands, containers, keys)
    request, request_problems = read_pod_request(shorthands)
    translation = translate(shorthands, request, target)
    translated = dict(translation.items()) if translation else {}
    on_target = keys
    if shorthands.targeting() and target.container is not None and keys.keys() - {target.container}:
        # The keys naming another container are denied (keysNameTheTarget); reading them as fractions too would
        # only repeat it.
        on_target = {name: entry for name, entry in keys.items() if name == target.container}
    merged = merged_keys(on_target, translation)
    value_problems: list[Violation] = []
    requests = {}
    for name, entry in merged.items():
        requests[name], problems = read_container_request(entry, request, translated)
        value_problems += problems
    fractions = build_fractions(requests, request, target, containers)
    values = Values(annotations, containers, bound, allow_multiple, shorthands, keys, target, request, translation,
                    translated, merged, requests, fractions)
    return values, {read_container_keys: key_problems, read_target: target_problems,
                    read_pod_request: request_problems, read_container_request: value_problems}


def _each_fraction(values: Values) -> list[Values]:
    return [replace(values, fractions={name: fraction}) for name, fraction in values.fractions.items()]


def _resolve(annotations: dict[str, str], containers: Containers, bound: bool,
             allow_multiple: bool) -> tuple[PodFractions, list[Violation]]:
    values, found = read_values(annotations, containers, bound, allow_multiple)
    violations = run(Phase.VALUE, values, found, by_fraction=_each_fraction)
    fractions = dict(values.fractions)
    lone_mode = lone_compute_mode(values.shorthands, set(fractions))
    others = [v for v in violations if v.subject != f"annotation {ann.COMPUTE_MODE}"]
    if lone_mode is not None and not others:
        # Nothing is translated: the pod is left as it is. Its value is not judged either, as nothing reads it.
        return PodFractions({}, {}, (lone_mode,)), []
    translated = {k: v for k, v in values.translated.items() if k not in annotations}
    return PodFractions(fractions, translated), violations
