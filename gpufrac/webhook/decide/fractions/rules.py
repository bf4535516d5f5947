"""One small function per rule about the values, on the whole pod, on each container's keys and on the
fractions (KAI's gpu_sharing_validation.go); each returns the violations it finds."""

from __future__ import annotations

import functools
from collections.abc import Mapping

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import Field
from gpufrac.core.quantity import (
    QuantityError,
    parse,
    parse_decimal,
)
from gpufrac.webhook.decide.errors import Violation, annotation, show_value
from gpufrac.webhook.decide.fractions.model import (
    PORTION_LIMIT,
    ContainerFraction,
    ContainerKeys,
    ContainerRequest,
    Containers,
    PodRequest,
    Shorthands,
    Target,
)
from gpufrac.webhook.decide.fractions.read import (
    keyed_container,
)

# The shorthand each translated field comes from.
_SOURCE_OF: dict[str, str] = {Field.MEMORY_REQUEST: ann.MEMORY, Field.MEMORY_LIMIT: ann.MEMORY_LIMIT,
                              PORTION_LIMIT: ann.FRACTION_LIMIT, Field.COMPUTE_MODE: ann.COMPUTE_MODE}


def rule_fraction_or_memory(shorthands: Shorthands) -> list[Violation]:
    """KAI: "cannot request both gpu-fraction and GPU memory request"."""
    if shorthands.get(ann.FRACTION) is None or shorthands.get(ann.MEMORY) is None:
        return []
    return [annotation(ann.MEMORY, shorthands.values[ann.MEMORY], f"cannot be used together with {ann.FRACTION}: "
                       "ask for a portion or for an amount of memory, not both")]


def rule_portion_without_absolute_memory(shorthands: Shorthands, keys: dict[str, ContainerKeys],
                                         bound: bool) -> list[Violation]:
    """A portion's absolute memory is the scheduler's to write at bind (KAI: the binder writes the request)."""
    if shorthands.get(ann.FRACTION) is None or bound:
        return []
    return [annotation(key, value, f"cannot be used together with {ann.FRACTION}: the scheduler writes absolute "
                                   "memory for portion requests at bind")
            for entry in keys.values() for key, value in entry.items()
            if key.endswith((f".{Field.MEMORY_REQUEST}", f".{Field.MEMORY_LIMIT}"))]


def rule_container_limit_needs_memory_limit(shorthands: Shorthands, keys: dict[str, ContainerKeys]) -> list[Violation]:
    """KAI: "cannot combine nvidia.com/container. limit annotation with gpu-fraction or gpu-memory annotation"
    (with gpu-memory, allowed only next to gpu-memory.limit)."""
    if shorthands.get(ann.MEMORY) is None or shorthands.get(ann.MEMORY_LIMIT) is not None:
        return []
    return [annotation(key, value, f"cannot be used together with {ann.MEMORY} alone: write the limit as "
                                   f"{ann.MEMORY_LIMIT}, or write both request and limit per container")
            for entry in keys.values() for key, value in entry.items() if key.endswith(f".{Field.MEMORY_LIMIT}")]


def rule_keys_name_the_target(shorthands: Shorthands, keys: dict[str, ContainerKeys],
                              target: Target) -> list[Violation]:
    """With pod-level shorthands, the per-container keys name the container they apply to, which is the target
    (KAI: "gpu-fraction-container-name annotation value ... does not match container name ...")."""
    targeting = shorthands.targeting()
    if not targeting or target.container is None:
        return []
    out = []
    several = keyed_container(keys) is None and len(keys) > 1
    for name in sorted(keys.keys() - {target.container}):
        for key, value in keys[name].items():
            if target.explicit:
                problem = (f"names container {name}, but {ann.CONTAINER_NAME} is {target.container}; the fraction "
                           "annotations of a pod name one container")
            elif several:
                problem = (f"names container {name}, but the fraction annotations of this pod name "
                           f"{', '.join(sorted(keys))}; they name one container, which {targeting[0]} applies to")
            else:
                problem = (f"names container {name}, but {targeting[0]} applies to {target.container}; set "
                           f"{ann.CONTAINER_NAME} to {name}")
            out.append(annotation(key, value, problem))
    return out


def rule_portion_limit_names_the_first_container(shorthands: Shorthands, merged: Mapping[str, ContainerKeys],
                                                 target: Target, containers: Containers) -> list[Violation]:
    """KAI's validator reads a portion limit as the limit of gpu-fraction-container-name, else of the first container
    (validateGpuMemoryPortionLimitContainerName), even where its keys put the fraction on another container."""
    name = target.container
    if target.explicit or name is None or name == containers.first or name not in merged \
            or PORTION_LIMIT not in merged[name].fields:
        return []
    key = merged[name].key(PORTION_LIMIT)
    written = ann.FRACTION_LIMIT if ann.FRACTION_LIMIT in shorthands.values else key
    return [annotation(written, merged[name].fields[PORTION_LIMIT], f"applies to container {name}, which the "
                       f"nvidia.com/container.{name}.* annotations name, but KAI reads a portion limit as the first "
                       f"container's ({containers.first}) unless {ann.CONTAINER_NAME} says otherwise: set "
                       f"{ann.CONTAINER_NAME} to {name}")]


def rule_translation_agrees(translation: ContainerKeys | None, annotations: Mapping[str, str],
                            bound: bool) -> list[Violation]:
    """A per-container key the pod already has must say what its shorthand says. On CREATE as text: KAI's admission
    compares the strings and denies a difference ("... annotation conflicts with ..."). After CREATE by value, as
    its validator does, so pods written by an older gpufrac still bind."""
    if translation is None:
        return []
    out = []
    for name, wanted in sorted(translation.fields.items()):
        key = translation.key(name)
        written = annotations.get(key)
        if written is None or written == wanted or (bound and _same_value(key, written, wanted)):
            continue
        if _same_value(key, written, wanted):
            problem = (f"says what {_SOURCE_OF[name]} says, written differently; KAI's admission compares the text "
                       f"and denies it: write {wanted} or drop one of them")
        else:
            problem = f"does not match {_SOURCE_OF[name]} ({wanted}); write one of them"
        out.append(annotation(key, written, problem))
    return out


def _same_value(key: str, written: str, wanted: str) -> bool:
    try:
        if key.endswith((f".{Field.MEMORY_REQUEST}", f".{Field.MEMORY_LIMIT}")):
            return parse(written).value == parse(wanted).value
        if key.endswith(f".{PORTION_LIMIT}"):
            return parse_decimal(written) == parse_decimal(wanted)
    except QuantityError:
        return False
    return False


def rule_num_devices_need_a_fraction(shorthands: Shorthands, keys: dict[str, ContainerKeys]) -> list[Violation]:
    """KAI: "cannot request multiple fractional devices without specifying fraction details"."""
    text = shorthands.get(ann.NUM_DEVICES)
    memory_keys = any(f in entry.fields for entry in keys.values() for f in (Field.MEMORY_REQUEST, Field.MEMORY_LIMIT))
    if text is None or shorthands.get(ann.FRACTION) is not None or shorthands.get(ann.MEMORY) is not None \
            or memory_keys:
        return []
    return [annotation(ann.NUM_DEVICES, text, f"needs a fraction to apply to: {ann.FRACTION}, {ann.MEMORY} or "
                                              "nvidia.com/container.<c>.gpu-memory.request")]


def rule_request_within_limit(requests: Mapping[str, ContainerRequest]) -> list[Violation]:
    """KAI: "request is greater than limit", compared in exact bytes (2047999Ki is below 2000Mi)."""
    out = []
    for _, entry in sorted(requests.items()):
        if entry.request is not None and entry.limit is not None and entry.limit.bytes < entry.request.bytes:
            key = entry.keys.key(Field.MEMORY_LIMIT)
            out.append(annotation(key, entry.limit.text, f"must not be smaller than the request "
                                                         f"({entry.request.describe()})"))
    return out


def rule_mode_and_devices_need_a_fraction(requests: Mapping[str, ContainerRequest], request: PodRequest,
                                          target: Target, fractional: set[str],
                                          translated: Mapping[str, str]) -> list[Violation]:
    """A mode or a device list is for a container that holds a fraction."""
    out = []
    for name, entry in sorted(requests.items()):
        if name in fractional or entry.asks_memory or (request.fraction_text is not None and name == target.container):
            continue  # a fraction, or one whose values were wrong and are reported already
        if Field.COMPUTE_MODE in entry.keys.fields and entry.keys.key(Field.COMPUTE_MODE) not in translated:
            portion = ann.FRACTION if name == target.container else f"{ann.FRACTION} with {ann.CONTAINER_NAME}: {name}"
            out.append(annotation(entry.keys.key(Field.COMPUTE_MODE), entry.keys.fields[Field.COMPUTE_MODE],
                                  f"needs a GPU memory request for container {name} "
                                  f"({ann.nvidia_key(name, Field.MEMORY_REQUEST)} or {portion})"))
        for bind_only in ann.BIND_ONLY_FIELDS:
            if bind_only in entry.keys.fields:
                out.append(annotation(entry.keys.key(bind_only), entry.keys.fields[bind_only],
                                      f"is set, but container {name} asks for no GPU fraction"))
    return out


def lone_compute_mode(shorthands: Shorthands, fractional: set[str]) -> str | None:
    """A pod-level compute mode on a pod with no fraction (a whole-GPU pod written for KAI, which ignores it): left
    as it is, with a warning instead of a denial."""
    text = shorthands.get(ann.COMPUTE_MODE)
    if text is None or fractional:
        return None
    return (f"annotation {ann.COMPUTE_MODE}: {show_value(text)} is ignored: the pod asks for no GPU fraction "
            f"({ann.FRACTION}, {ann.MEMORY} or nvidia.com/container.<c>.gpu-memory.request) for a compute mode to "
            "apply to (KAI ignores it too); the pod is left as it is")


def rule_one_fraction_container(fractions: Mapping[str, ContainerFraction], allow_multiple: bool) -> list[Violation]:
    """KAI's binder binds one fraction container per pod (GetFractionContainerRef): a pod with more never starts."""
    if allow_multiple or len(fractions) < 2:
        return []
    return [Violation("pod", f"asks for GPU fractions in {len(fractions)} containers ({', '.join(fractions)}); KAI's "
                             "binder binds the fraction of one container per pod, so this pod would never start: put "
                             "the GPU work in one container, or in separate pods")]


def rule_one_compute_mode(fractions: Mapping[str, ContainerFraction]) -> list[Violation]:
    if len({c.mode for c in fractions.values()}) < 2:
        return []
    listing = ", ".join(f"{c.container}={c.mode}" for c in fractions.values())
    return [Violation("pod", f"mixes compute modes across containers ({listing}); a pod's fractions share one mode, "
                             "so set the same gpu-compute.mode on each")]


def rule_devices_follow_the_request(fraction: ContainerFraction) -> list[Violation]:
    if not fraction.devices:
        return []
    name, key = fraction.container, ann.nvidia_key(fraction.container, Field.DEVICES)
    shown = ",".join(fraction.devices)
    out = []
    if fraction.memory is None:
        out.append(annotation(key, shown, f"assigns devices to container {name}, whose portion request has no memory "
                              f"in MiB yet: the scheduler writes {ann.nvidia_key(name, Field.MEMORY_REQUEST)} (and "
                              ".limit) in the same update, or the container would start without a memory limit"))
    if len(fraction.devices) != fraction.num_devices:
        out.append(annotation(key, shown, f"lists {len(fraction.devices)} devices, but the pod asks for "
                                          f"{fraction.num_devices} ({ann.NUM_DEVICES})"))
    return out


def keys_for(fraction: ContainerFraction, name: str | None = None) -> list[str]:
    """Every key gpufrac or the scheduler writes for this container (or for one named `name` instead): the
    canonical ones, the scheduler's bind-time ones, and the portion limit where one is used."""
    return keys_for_name(fraction.container if name is None else name, _has_portion_limit(fraction))


def _has_portion_limit(fraction: ContainerFraction) -> bool:
    return fraction.portion is not None and fraction.portion.limit is not None


def keys_for_name(name: str, portion_limit: bool) -> list[str]:
    keys = [ann.canonical_key(name, f) for f in ann.CanonicalField]
    keys += [ann.nvidia_key(name, f) for f in (Field.MEMORY_REQUEST, Field.MEMORY_LIMIT, Field.DEVICES)]
    if portion_limit:
        keys.append(ann.portion_limit_key(name))
    return keys


@functools.cache  # two possible answers
def longest_key(portion_limit: bool) -> tuple[int, int]:
    """(position in `_keys`, length of its name part less the container name) of the key with the longest rest:
    the keys differ only in the container name, so that one decides how long a name may be."""
    rests = [ann.key_name_length(k) for k in keys_for_name("", portion_limit)]
    longest = max(rests)
    return rests.index(longest), longest


def rule_name_fits_the_keys(fraction: ContainerFraction) -> list[Violation]:
    """The container name is part of each key, whose name part Kubernetes caps at 63 characters."""
    name = fraction.container
    if not ann.is_container_name(name):
        return [Violation(f"container {name}", "has a name that cannot be part of an annotation key (a lowercase "
                                               "DNS-1123 label is needed); rename it")]
    position, rest = longest_key(_has_portion_limit(fraction))
    allowed = ann.KEY_NAME_MAX - rest
    if len(name) <= allowed:
        return []
    key = keys_for(fraction)[position]
    return [Violation(f"container {name}", f"has a name longer than {allowed} characters, too long for the annotation "
                                           f"key {key} (at most {ann.KEY_NAME_MAX} characters after the /); shorten "
                                           "it")]
