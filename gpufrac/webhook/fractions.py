"""From a pod's annotations to what each of its containers asked for: one typed value per fractional container.

Pure. Every rule about the values themselves lives here (docs/architecture.md, "One review"), so the mutating and the
validating webhook judge a pod the same way. Rules about who may change what live in `validation.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import ComputeMode, Field
from gpufrac.core.contract import MIB, mib_ceil
from gpufrac.core.quantity import (
    QuantityError,
    decimals_after_point,
    has_unit,
    parse_decimal,
    parse_quantity,
)
from gpufrac.webhook import pod as podview
from gpufrac.webhook.errors import Violation, annotation

MAX_DEVICES = 64  # one MPS pinned-memory entry per device; no node has more, and it bounds hostile input
MAX_MIB = 1 << 40  # an exbibyte per device: beyond any GPU, and keeps every number small
_PORTION_DIGITS = 5  # KAI rejects portion limits with more digits after the point
_LISTED_CONTAINERS = 10  # a denial lists the pod's containers, but not thousands of them
_POSITIVE_INTEGER = re.compile(r"^[0-9]{1,15}$")

FRACTION_RANGE = "must be a decimal number strictly between 0 and 1, such as 0.5"
MEMORY_QUANTITY = "must be a Kubernetes memory quantity of at least 1Mi, such as 40Gi"


@dataclass(frozen=True)
class Memory:
    """Absolute GPU memory per device, in whole MiB."""

    request_mib: int
    limit_mib: int


@dataclass(frozen=True)
class Portion:
    """A share of each device's memory; turned into Memory by the scheduler at bind."""

    fraction: Decimal
    limit: Decimal | None


@dataclass(frozen=True)
class ContainerFraction:
    """What one container asked for. `memory` is None for a portion request that is not bound yet."""

    container: str
    mode: ComputeMode
    num_devices: int
    memory: Memory | None
    portion: Portion | None
    devices: tuple[str, ...]


@dataclass(frozen=True)
class PodFractions:
    containers: dict[str, ContainerFraction]
    # Per-container keys the webhook writes on CREATE, translated from the pod-level shorthands.
    translated: dict[str, str]

    @property
    def is_fractional(self) -> bool:
        return bool(self.containers)

    def names(self) -> set[str]:
        return set(self.containers)


@dataclass
class _Container:
    """What the annotations say of one container, as parsed so far."""

    request: int | None = None  # MiB
    limit: int | None = None
    portion_limit: Decimal | None = None
    mode: ComputeMode | None = None
    devices: tuple[str, ...] = ()
    memory_keys: bool = False  # any nvidia.com gpu-memory key names this container


def _memory_mib(key: str, value: str, out: list[Violation]) -> int | None:
    try:
        amount = parse_quantity(value)
    except QuantityError:
        out.append(annotation(key, value, MEMORY_QUANTITY))
        return None
    if amount < MIB:
        problem = "must be greater than 0" if amount <= 0 else "is below 1Mi, the smallest GPU memory gpufrac sets"
        out.append(annotation(key, value, f"{problem}; use a quantity such as 40Gi"))
        return None
    if amount > MAX_MIB * MIB:
        out.append(annotation(key, value, "is larger than any GPU; use a quantity such as 40Gi"))
        return None
    return mib_ceil(amount)


def _fraction(key: str, value: str, out: list[Violation]) -> Decimal | None:
    try:
        number = parse_decimal(value)
    except QuantityError:
        out.append(annotation(key, value, FRACTION_RANGE))
        return None
    if not Decimal(0) < number < Decimal(1):
        out.append(annotation(key, value, FRACTION_RANGE))
        return None
    return number


def _portion_limit(key: str, value: str, fraction: Decimal | None, fraction_raw: str | None,
                   out: list[Violation]) -> Decimal | None:
    if fraction_raw is None:
        out.append(annotation(key, value, f"can only be used together with the {ann.FRACTION} annotation"))
        return None
    try:
        number = parse_decimal(value)
    except QuantityError:
        number = None
    bounds = (f"must be greater than {ann.FRACTION} ({fraction_raw}) and less than 1"
              if fraction is not None else "must be a decimal number less than 1 and greater than gpu-fraction")
    if number is None or fraction is None or not fraction < number < 1:
        out.append(annotation(key, value, bounds))
        return None
    if decimals_after_point(value) > _PORTION_DIGITS:
        out.append(annotation(key, value, f"must have at most {_PORTION_DIGITS} digits after the decimal point"))
        return None
    return number


def _positive_integer(key: str, value: str, accepted: str, out: list[Violation], maximum: int) -> int | None:
    if not _POSITIVE_INTEGER.fullmatch(value) or not 0 < int(value) <= maximum:
        out.append(annotation(key, value, f"must be {accepted}"))
        return None
    return int(value)


def resolve(obj: dict[str, Any], *, bound: bool) -> tuple[PodFractions, list[Violation]]:
    """Read every fraction annotation of a pod into per-container requests, with every violation found.

    `bound`: whether absolute memory values next to `gpu-fraction` are the scheduler's bind-time values (an
    UPDATE after CREATE, whose authorship `validation` checks) rather than something the user wrote.
    """
    out: list[Violation] = []
    annotations = podview.annotations(obj)
    refs = list(podview.containers(obj, podview.ContainerKind.CONTAINER, podview.ContainerKind.INIT))
    names = [r.name for r in refs]
    known = set(names)
    regular = [r.name for r in refs if r.kind is podview.ContainerKind.CONTAINER]
    shown = ", ".join(names[:_LISTED_CONTAINERS]) if names else "no containers"
    has_list = shown if len(names) <= _LISTED_CONTAINERS else f"{shown} and {len(names) - _LISTED_CONTAINERS} more"
    parsed: dict[str, _Container] = {}

    def container(key: str, name: str) -> _Container | None:
        if name not in known:
            out.append(annotation(key, None, f"names container {name}, but the pod has {has_list}"))
            return None
        return parsed.setdefault(name, _Container())

    fraction_raw = annotations.get(ann.FRACTION)
    fraction = _fraction(ann.FRACTION, fraction_raw, out) if fraction_raw is not None else None
    memory_raw = annotations.get(ann.MEMORY)

    # Which container the pod-level shorthands apply to.
    target_name = annotations.get(ann.CONTAINER_NAME)
    if target_name is not None:
        if target_name not in known:
            out.append(annotation(ann.CONTAINER_NAME, target_name, f"must name a container of the pod: {has_list}"))
            target_name = None
    elif regular:
        target_name = regular[0]

    portion_limit_keys: list[tuple[str, str, str]] = []
    for key, value in annotations.items():
        try:
            parsed_key = ann.parse_container_key(key)
        except ann.MalformedKeyError as exc:
            out.append(annotation(key, None, f"is not a key gpufrac knows: {exc.accepted}"))
            continue
        if parsed_key is None or parsed_key.prefix == ann.CANONICAL_PREFIX:
            continue  # canonical keys are outputs: `validation` compares them with what they should be
        entry = container(key, parsed_key.container)
        if entry is None:
            continue
        if parsed_key.prefix == ann.KAI_PREFIX:
            portion_limit_keys.append((key, value, parsed_key.container))
        elif parsed_key.suffix in (Field.MEMORY_REQUEST, Field.MEMORY_LIMIT):
            entry.memory_keys = True
            mib = _memory_mib(key, value, out)
            if parsed_key.suffix == Field.MEMORY_REQUEST:
                entry.request = mib
            else:
                entry.limit = mib
        elif parsed_key.suffix == Field.COMPUTE_MODE:
            try:
                entry.mode = ComputeMode(value)
            except ValueError:
                out.append(annotation(key, value, f"must be {' or '.join(ComputeMode)}"))
        elif parsed_key.suffix == Field.DEVICES:
            try:
                entry.devices = ann.parse_devices(value)
            except ValueError as exc:
                out.append(annotation(key, value, f"must be a comma-separated list of GPU UUIDs or CDI device "
                                                   f"names, such as GPU-<uuid>,GPU-<uuid> (bad entry: {exc})"))

    translated: dict[str, str] = {}
    nvidia_memory = [n for n, c in parsed.items() if c.memory_keys]

    if fraction_raw is not None and memory_raw is not None:
        out.append(annotation(ann.MEMORY, memory_raw, f"cannot be used together with {ann.FRACTION}: "
                                                      "ask for a portion or for an amount of memory, not both"))
    if fraction_raw is not None and nvidia_memory and not bound:
        key = next(k for k in annotations if k.startswith(ann.NVIDIA_PREFIX) and ".gpu-memory." in k)
        out.append(annotation(key, annotations[key], f"cannot be used together with {ann.FRACTION}: the "
                                                      "scheduler writes absolute memory for portion requests at bind"))

    # gpu-memory / gpu-memory.limit: absolute MiB for the target container.
    if memory_raw is not None:
        memory = _positive_integer(ann.MEMORY, memory_raw, "a positive whole number of MiB, such as 20480",
                                   out, MAX_MIB)
        limit_raw = annotations.get(ann.MEMORY_LIMIT)
        if memory is not None and target_name is not None and fraction_raw is None:
            entry = parsed.setdefault(target_name, _Container())
            request_key = ann.nvidia_key(target_name, Field.MEMORY_REQUEST)
            if entry.request is not None and entry.request != memory:
                out.append(annotation(request_key, annotations[request_key],
                                      f"does not match {ann.MEMORY} ({memory_raw} MiB); write one of them"))
            entry.request = memory
            translated[request_key] = f"{memory}Mi"
        if limit_raw is not None and memory is not None:
            if not has_unit(limit_raw):
                out.append(annotation(ann.MEMORY_LIMIT, limit_raw, "must be a memory quantity with a unit, "
                                                                   "such as 60Gi"))
            else:
                limit = _memory_mib(ann.MEMORY_LIMIT, limit_raw, out)
                if limit is not None and limit < memory:
                    out.append(annotation(ann.MEMORY_LIMIT, limit_raw,
                                          f"must not be smaller than {ann.MEMORY} ({memory_raw} MiB)"))
                elif limit is not None and target_name is not None and fraction_raw is None:
                    entry = parsed.setdefault(target_name, _Container())
                    limit_key = ann.nvidia_key(target_name, Field.MEMORY_LIMIT)
                    if entry.limit is not None and entry.limit != limit:
                        out.append(annotation(limit_key, annotations[limit_key],
                                              f"does not match {ann.MEMORY_LIMIT} ({limit_raw}); write one of them"))
                    entry.limit = limit
                    translated[limit_key] = limit_raw
    elif ann.MEMORY_LIMIT in annotations:
        out.append(annotation(ann.MEMORY_LIMIT, annotations[ann.MEMORY_LIMIT],
                              f"can only be used together with the {ann.MEMORY} annotation"))

    # Portion limits: the shorthand and the per-container key mean the same thing for the target container.
    portion_limit: Decimal | None = None
    shorthand_limit = annotations.get(ann.FRACTION_LIMIT)
    if shorthand_limit is not None:
        portion_limit = _portion_limit(ann.FRACTION_LIMIT, shorthand_limit, fraction, fraction_raw, out)
        if portion_limit is not None and target_name is not None:
            translated[ann.portion_limit_key(target_name)] = shorthand_limit
    for key, value, name in portion_limit_keys:
        if fraction_raw is not None and name != target_name:
            out.append(annotation(key, value, f"names container {name}, but {ann.FRACTION} applies to "
                                              f"{target_name}; set {ann.CONTAINER_NAME} to {name}"))
            continue
        limit = _portion_limit(key, value, fraction, fraction_raw, out)
        if limit is None:
            continue
        if shorthand_limit is not None and portion_limit is not None and limit != portion_limit:
            out.append(annotation(key, value, f"does not match {ann.FRACTION_LIMIT} ({shorthand_limit}); "
                                              "write one of them"))
        portion_limit = limit
        parsed[name].portion_limit = limit

    num_devices = 1
    num_raw = annotations.get(ann.NUM_DEVICES)
    if num_raw is not None:
        num_devices = _positive_integer(ann.NUM_DEVICES, num_raw,
                                        f"a whole number of devices from 1 to {MAX_DEVICES}", out, MAX_DEVICES) or 1

    result: dict[str, ContainerFraction] = {}
    for name in names:
        entry = parsed.get(name)
        is_portion = fraction is not None and name == target_name
        if entry is None and not is_portion:
            continue
        entry = entry or _Container()
        memory_value: Memory | None = None
        if entry.request is not None or entry.limit is not None:
            request = entry.request if entry.request is not None else entry.limit
            limit = entry.limit if entry.limit is not None else entry.request
            assert request is not None and limit is not None
            if limit < request:
                key = ann.nvidia_key(name, Field.MEMORY_LIMIT)
                out.append(annotation(key, annotations.get(key, annotations.get(ann.MEMORY_LIMIT, "")),
                                      f"must not be smaller than the request ({request} MiB)"))
            memory_value = Memory(request, limit)
        portion_value = Portion(fraction, portion_limit) if is_portion and fraction is not None else None
        if memory_value is None and portion_value is None:
            if entry.memory_keys or (fraction_raw is not None and name == target_name):
                continue  # its values were invalid and already reported
            if entry.mode is not None:
                key = ann.nvidia_key(name, Field.COMPUTE_MODE)
                out.append(annotation(key, annotations[key], f"needs a GPU memory request for container {name} "
                                      f"({ann.nvidia_key(name, Field.MEMORY_REQUEST)} or {ann.FRACTION})"))
            if entry.devices:
                key = ann.nvidia_key(name, Field.DEVICES)
                out.append(annotation(key, annotations[key], f"is set, but container {name} asks for no GPU "
                                                             "fraction"))
            continue
        if entry.devices and memory_value is None:
            key = ann.nvidia_key(name, Field.DEVICES)
            out.append(annotation(key, annotations[key], f"assigns devices to container {name}, whose portion "
                                  "request has no memory in MiB yet: the scheduler writes "
                                  f"{ann.nvidia_key(name, Field.MEMORY_REQUEST)} (and .limit) in the same update, "
                                  "or the container would start without a memory limit"))
        if entry.devices and len(entry.devices) != num_devices:
            key = ann.nvidia_key(name, Field.DEVICES)
            out.append(annotation(key, annotations[key], f"lists {len(entry.devices)} devices, but the pod asks "
                                                         f"for {num_devices} ({ann.NUM_DEVICES})"))
        if not ann.is_container_name(name):
            out.append(Violation(f"container {name}", "has a name that cannot be part of an annotation key (a "
                                 "lowercase DNS-1123 label is needed); rename it"))
        elif len(name) > ann.max_container_name_length():
            out.append(Violation(f"container {name}", f"has a name longer than {ann.max_container_name_length()} "
                                 "characters, too long for the fraction annotation keys; shorten it"))
        result[name] = ContainerFraction(
            container=name,
            mode=entry.mode or ann.DEFAULT_MODE,
            num_devices=num_devices,
            memory=memory_value,
            portion=portion_value,
            devices=entry.devices,
        )

    if num_raw is not None and not result and fraction_raw is None and memory_raw is None and not nvidia_memory:
        out.append(annotation(ann.NUM_DEVICES, num_raw, f"needs a fraction to apply to: {ann.FRACTION}, "
                                                        f"{ann.MEMORY} or nvidia.com/container.<c>.gpu-memory.request"))
    modes = {c.mode for c in result.values()}
    if len(modes) > 1:
        listing = ", ".join(f"{c.container}={c.mode}" for c in result.values())
        out.append(Violation("pod", f"mixes compute modes across containers ({listing}); a pod's fractions share "
                                    "one mode, so set the same gpu-compute.mode on each"))
    return PodFractions(result, translated), out
