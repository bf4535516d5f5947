"""`resolve`: the readers and rules composed, from a pod's annotations to its fractions with every violation
found, memoized by the fraction annotations and container names."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufrac.core import annotations as ann
from gpufrac.core.contract import mib_ceil
from gpufrac.webhook.decide import pod as podview
from gpufrac.webhook.decide.errors import Violation
from gpufrac.webhook.decide.fractions.model import (
    ContainerFraction,
    ContainerRequest,
    Containers,
    Memory,
    PodFractions,
    PodRequest,
    Portion,
    Target,
)
from gpufrac.webhook.decide.fractions.read import (
    merged_keys,
    read_container_keys,
    read_container_request,
    read_containers,
    read_fraction,
    read_pod_request,
    read_shorthands,
    read_target,
    translate,
)
from gpufrac.webhook.decide.fractions.rules import (
    lone_compute_mode,
    rule_container_limit_needs_memory_limit,
    rule_devices_follow_the_request,
    rule_fraction_or_memory,
    rule_keys_name_the_target,
    rule_mode_and_devices_need_a_fraction,
    rule_name_fits_the_keys,
    rule_num_devices_need_a_fraction,
    rule_one_compute_mode,
    rule_one_fraction_container,
    rule_portion_limit_names_the_first_container,
    rule_portion_without_absolute_memory,
    rule_request_within_limit,
    rule_translation_agrees,
)


def _memory(entry: ContainerRequest) -> Memory | None:
    """Request and limit in whole MiB, each defaulting to the other (KAI: defaultRequestFromLimit)."""
    request = entry.request or entry.limit
    limit = entry.limit or entry.request
    if request is None or limit is None:
        return None
    return Memory(mib_ceil(request.bytes), mib_ceil(limit.bytes))


def build_fractions(requests: Mapping[str, ContainerRequest], request: PodRequest, target: Target,
                    containers: Containers) -> dict[str, ContainerFraction]:
    result: dict[str, ContainerFraction] = {}
    for name in containers.names:
        entry = requests.get(name)
        portion = (Portion(request.fraction, entry.portion_limit if entry else None)
                   if request.fraction is not None and name == target.container else None)
        memory = _memory(entry) if entry is not None else None
        if memory is None and portion is None:
            continue
        result[name] = ContainerFraction(
            container=name,
            mode=(entry.mode if entry else None) or ann.DEFAULT_MODE,
            num_devices=request.num_devices,
            memory=memory,
            portion=portion,
            devices=entry.devices if entry else (),
            compute_portion=entry.compute_portion if entry else None,
        )
    return result


@dataclass
class _Review:
    """What `resolve` has read so far."""

    violations: list[Violation] = field(default_factory=list)

    def add(self, found: tuple[Any, list[Violation]]) -> Any:
        value, problems = found
        self.violations += problems
        return value


def portion_container(obj: dict[str, Any]) -> str | None:
    """The container whose fraction is a portion (a valid gpu-fraction's target), as `resolve` finds it, without
    reading the rest: what the scheduler may write memory for at bind."""
    annotations = podview.annotations(obj)
    containers = read_containers(obj)
    text = annotations.get(ann.FRACTION)
    if text is None or read_fraction(ann.FRACTION, text)[0] is None:
        return None
    keys, _ = read_container_keys(annotations, containers)
    return read_target(read_shorthands(annotations), containers, keys)[0].container


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


def _resolve(annotations: dict[str, str], containers: Containers, bound: bool,
             allow_multiple: bool) -> tuple[PodFractions, list[Violation]]:
    review = _Review()
    shorthands = read_shorthands(annotations)
    keys = review.add(read_container_keys(annotations, containers))
    target = review.add(read_target(shorthands, containers, keys))
    request = review.add(read_pod_request(shorthands))
    translation = translate(shorthands, request, target)
    translated = dict(translation.items()) if translation else {}
    review.violations += [*rule_fraction_or_memory(shorthands),
                          *rule_portion_without_absolute_memory(shorthands, keys, bound),
                          *rule_container_limit_needs_memory_limit(shorthands, keys),
                          *rule_translation_agrees(translation, annotations, bound),
                          *rule_num_devices_need_a_fraction(shorthands, keys)]
    off_target = rule_keys_name_the_target(shorthands, keys, target)
    review.violations += off_target
    if off_target:  # denied already; reading them as fractions too would only repeat it
        keys = {name: entry for name, entry in keys.items() if name == target.container}
    merged = merged_keys(keys, translation)
    review.violations += rule_portion_limit_names_the_first_container(shorthands, merged, target, containers)
    requests = {name: review.add(read_container_request(entry, request, translated))
                for name, entry in merged.items()}
    fractions = build_fractions(requests, request, target, containers)
    review.violations += [*rule_request_within_limit(requests),
                          *rule_mode_and_devices_need_a_fraction(requests, request, target, set(fractions), translated),
                          *rule_one_fraction_container(fractions, allow_multiple),
                          *rule_one_compute_mode(fractions)]
    for fraction in fractions.values():
        review.violations += [*rule_devices_follow_the_request(fraction), *rule_name_fits_the_keys(fraction)]
    lone_mode = lone_compute_mode(shorthands, set(fractions))
    others = [v for v in review.violations if v.subject != f"annotation {ann.COMPUTE_MODE}"]
    if lone_mode is not None and not others:
        # Nothing is translated: the pod is left as it is. Its value is not judged either, as nothing reads it.
        return PodFractions({}, {}, (lone_mode,)), []
    return PodFractions(fractions, {k: v for k, v in translated.items() if k not in annotations}), review.violations
