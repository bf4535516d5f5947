"""From a pod's annotations to what each of its containers asked for: one typed value per fractional container.

Pure. Every rule about the values themselves lives here (docs/architecture.md, "One review"), so the mutating and the
validating webhook judge a pod the same way. Rules about who may change what live in `validation.py`.

Shaped like KAI's shared validator (kai-scheduler/KAI-Scheduler pkg/common/resources/gpu_sharing_validation.go):
one reader per source (the pod's containers, the pod-level shorthands, the per-container keys, the container the
shorthands apply to), one small function per rule, and `resolve` composing them. Unlike KAI, which stops at the
first error, every violation is collected. Where KAI judges the text (portion-limit digits, the strings its
admission writes and compares), so does gpufrac; where it judges a value, gpufrac reads the value the way KAI's
scheduler and binder do (binary64 for portions, exact bytes for quantities).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import ComputeMode, Field
from gpufrac.core.contract import MIB, mib_ceil
from gpufrac.core.quantity import (
    QuantityError,
    as_binary64,
    characters_after_point,
    decimals_after_point,
    mebibytes,
    parse,
    parse_decimal,
    parse_whole_number,
    plain,
)
from gpufrac.webhook import pod as podview
from gpufrac.webhook.errors import Violation, annotation

MAX_DEVICES = 64  # one MPS pinned-memory entry per device; no node has more, and it bounds hostile input
MAX_MIB = 1 << 40  # an exbibyte per device: beyond any GPU, and keeps every number small
PORTION_DIGITS = 5  # KAI rejects portion limits with more digits after the point
_LISTED_CONTAINERS = 10  # a denial lists the pod's containers, but not thousands of them
PORTION_LIMIT = ann.PORTION_LIMIT_SUFFIX  # the per-container field under `kai.scheduler/container.<c>.`
# Shorthands that apply to one container (gpu-fraction-num-devices applies to the pod).
_TARGETING = (ann.FRACTION, ann.MEMORY, ann.FRACTION_LIMIT, ann.MEMORY_LIMIT, ann.COMPUTE_MODE, ann.CONTAINER_NAME)

FRACTION_RANGE = "must be a decimal number strictly between 0 and 1, such as 0.5"
MEMORY_QUANTITY = "must be a Kubernetes memory quantity of at least 1Mi, such as 40Gi"
WHOLE_MIB = "must be a positive whole number of MiB, such as 20480"


# --- What the pod asked for: the result -----------------------------------------------------------------------


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


# --- Readers: one per source ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Containers:
    """The containers annotation keys may name: regular, then init (KAI allows init containers too)."""

    names: tuple[str, ...]
    first: str | None  # spec.containers[0], where the shorthands apply by default

    def listing(self) -> str:
        shown = ", ".join(self.names[:_LISTED_CONTAINERS]) if self.names else "no containers"
        more = len(self.names) - _LISTED_CONTAINERS
        return f"{shown} and {more} more" if more > 0 else shown


def read_containers(obj: dict[str, Any]) -> Containers:
    refs = list(podview.containers(obj, podview.ContainerKind.CONTAINER, podview.ContainerKind.INIT))
    regular = [r.name for r in refs if r.kind is podview.ContainerKind.CONTAINER]
    return Containers(tuple(r.name for r in refs), regular[0] if regular else None)


@dataclass(frozen=True)
class Shorthands:
    """The pod-level annotations (KAI's older vocabulary), as written."""

    values: Mapping[str, str]

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def targeting(self) -> list[str]:
        """The shorthands present that apply to one container, in a fixed order."""
        return [key for key in _TARGETING if key in self.values]


def read_shorthands(annotations: Mapping[str, str]) -> Shorthands:
    return Shorthands({key: annotations[key] for key in ann.SHORTHAND_KEYS if key in annotations})


@dataclass(frozen=True)
class ContainerKeys:
    """The per-container keys naming one container, as written: field (a `Field`, or PORTION_LIMIT) -> value."""

    container: str
    fields: Mapping[str, str]

    def key(self, name: str) -> str:
        prefix = ann.KAI_PREFIX if name == PORTION_LIMIT else ann.NVIDIA_PREFIX
        return f"{prefix}{self.container}.{name}"

    def items(self) -> Iterable[tuple[str, str]]:
        """(key, value) of every field, sorted by key so messages come in a stable order."""
        return sorted((self.key(name), value) for name, value in self.fields.items())


def read_container_keys(annotations: Mapping[str, str],
                        containers: Containers) -> tuple[dict[str, ContainerKeys], list[Violation]]:
    """`nvidia.com/container.<c>.*` and `kai.scheduler/container.<c>.*`, by container. Canonical `gpufrac.io/`
    keys are outputs: `validation` compares them with what they should be."""
    out: list[Violation] = []
    fields: dict[str, dict[str, str]] = {}
    for key, value in annotations.items():
        try:
            parsed = ann.parse_container_key(key)
        except ann.MalformedKeyError as exc:
            out.append(annotation(key, None, f"is not a key gpufrac knows: {exc.accepted}"))
            continue
        if parsed is None or parsed.prefix == ann.CANONICAL_PREFIX:
            continue
        if parsed.container not in containers.names:
            out.append(annotation(key, None, f"names container {parsed.container}, but the pod has "
                                             f"{containers.listing()}"))
            continue
        fields.setdefault(parsed.container, {})[parsed.suffix] = value
    return {name: ContainerKeys(name, values) for name, values in fields.items()}, out


@dataclass(frozen=True)
class Target:
    """The container the pod-level shorthands apply to: gpu-fraction-container-name, else the first container."""

    container: str | None
    explicit: bool  # named by gpu-fraction-container-name


def read_target(shorthands: Shorthands, containers: Containers) -> tuple[Target, list[Violation]]:
    name = shorthands.get(ann.CONTAINER_NAME)
    if name is None:
        return Target(containers.first, explicit=False), []
    if name not in containers.names:
        return Target(None, explicit=True), [annotation(ann.CONTAINER_NAME, name, "must name a container of the "
                                                        f"pod: {containers.listing()}")]
    return Target(name, explicit=True), []


# --- Values: each reads one annotation and says what is wrong with it ------------------------------------------


@dataclass(frozen=True)
class Amount:
    """A memory quantity, as written and in exact bytes."""

    text: str
    bytes: Decimal

    def describe(self) -> str:
        return f"{int(self.bytes) // MIB} MiB" if self.bytes % MIB == 0 else self.text


def read_amount(key: str, text: str) -> tuple[Amount | None, list[Violation]]:
    """A memory quantity: >= 1Mi (what the node agent, and KAI's fractiond, can set), <= 1 EiB."""
    try:
        value = parse(text).value
    except QuantityError:
        return None, [annotation(key, text, MEMORY_QUANTITY)]
    if value < MIB:
        problem = "must be greater than 0" if value <= 0 else "is below 1Mi, the smallest GPU memory gpufrac sets"
        return None, [annotation(key, text, f"{problem}; use a quantity such as 40Gi")]
    if value > MAX_MIB * MIB:
        return None, [annotation(key, text, "is larger than any GPU (at most 1Ei); use a quantity such as 40Gi")]
    return Amount(text, value), []


def read_fraction(key: str, text: str) -> tuple[Decimal | None, list[Violation]]:
    """A portion, as KAI's scheduler reads it (strconv.ParseFloat, binary64) and then hands it to its binder
    (fmt.Sprintf("%.2f"): pkg/scheduler/cache/cache.go), which cannot bind a portion of 0.00."""
    try:
        number, reading = parse_decimal(text), as_binary64(text)
    except QuantityError:
        return None, [annotation(key, text, FRACTION_RANGE)]
    if not 0 < number < 1:
        return None, [annotation(key, text, FRACTION_RANGE)]
    if not 0 < reading < 1:
        return None, [annotation(key, text, f"is {reading:g} as KAI's scheduler reads it (a binary64 number); "
                                            f"{FRACTION_RANGE}")]
    if f"{reading:.2f}" == "0.00":
        return None, [annotation(key, text, "is sent by KAI's scheduler to its binder with two decimals, as 0.00, "
                                            "and a portion of 0.00 is never bound; use 0.005 or more")]
    return number, []


def read_portion_limit(key: str, text: str, fraction: Decimal | None,
                       fraction_text: str | None) -> tuple[Decimal | None, list[Violation]]:
    """A portion limit: with gpu-fraction, strictly between it and 1, at most 5 digits after the point as KAI
    counts them in the text and as the number has them written plainly."""
    if fraction_text is None:
        return None, [annotation(key, text, f"can only be used together with the {ann.FRACTION} annotation")]
    bounds = (f"must be greater than {ann.FRACTION} ({fraction_text}) and less than 1" if fraction is not None
              else f"must be a decimal number less than 1 and greater than {ann.FRACTION}")
    try:
        number, reading = parse_decimal(text), as_binary64(text)
    except QuantityError:
        return None, [annotation(key, text, bounds)]
    if fraction is None or not float(fraction) < reading < 1:
        return None, [annotation(key, text, bounds)]
    if characters_after_point(text) > PORTION_DIGITS:
        return None, [annotation(key, text, f"must have at most {PORTION_DIGITS} digits after the decimal point")]
    if decimals_after_point(number) > PORTION_DIGITS:
        return None, [annotation(key, text, f"is {plain(number)}, which has {decimals_after_point(number)} digits "
                                            f"after the decimal point; at most {PORTION_DIGITS} are allowed")]
    return number, []


def read_memory_mib(text: str) -> tuple[int | None, list[Violation]]:
    """gpu-memory: whole MiB, as KAI reads it (strconv.ParseUint: digits only)."""
    try:
        mib = parse_whole_number(text)
    except QuantityError:
        return None, [annotation(ann.MEMORY, text, WHOLE_MIB)]
    if mib == 0:
        return None, [annotation(ann.MEMORY, text, WHOLE_MIB)]
    if mib > MAX_MIB:
        return None, [annotation(ann.MEMORY, text, f"is more than {MAX_MIB} MiB (1 EiB), the most gpufrac accepts "
                                                   "for one device; use a whole number of MiB such as 20480")]
    return mib, []


def read_memory_limit(text: str, memory_mib: int | None) -> tuple[Amount | None, list[Violation]]:
    """gpu-memory.limit: a quantity with a unit (KAI refuses what strconv.ParseFloat reads), >= gpu-memory."""
    try:
        quantity = parse(text)
    except QuantityError:
        quantity = None
    if quantity is None or not quantity.has_unit:
        return None, [annotation(ann.MEMORY_LIMIT, text, "must be a memory quantity with a unit, such as 60Gi")]
    amount, out = read_amount(ann.MEMORY_LIMIT, text)
    if amount is None or memory_mib is None:
        return None, out
    if amount.bytes < memory_mib * MIB:
        return None, [annotation(ann.MEMORY_LIMIT, text, f"must not be smaller than {ann.MEMORY} ({memory_mib} MiB)")]
    return amount, []


def read_num_devices(text: str) -> tuple[int | None, list[Violation]]:
    """gpu-fraction-num-devices, as KAI reads it (strconv.ParseInt: an optional sign, digits)."""
    accepted = f"must be a whole number of devices from 1 to {MAX_DEVICES}"
    try:
        count = parse_whole_number(text, signed=True)
    except QuantityError:
        return None, [annotation(ann.NUM_DEVICES, text, accepted)]
    if count > MAX_DEVICES:
        return None, [annotation(ann.NUM_DEVICES, text, f"{accepted} (gpufrac sets one MPS memory limit per device, "
                                                        f"for at most {MAX_DEVICES})")]
    return (count, []) if count > 0 else (None, [annotation(ann.NUM_DEVICES, text, accepted)])


def read_mode(key: str, text: str) -> tuple[ComputeMode | None, list[Violation]]:
    try:
        return ComputeMode(text), []
    except ValueError:
        return None, [annotation(key, text, f"must be {' or '.join(ComputeMode)}")]


def read_devices(key: str, text: str) -> tuple[tuple[str, ...], list[Violation]]:
    try:
        return ann.parse_devices(text), []
    except ValueError as exc:
        return (), [annotation(key, text, "must be a comma-separated list of GPU UUIDs or CDI device names, such as "
                                          f"GPU-<uuid>,GPU-<uuid> (bad entry: {exc})")]


@dataclass(frozen=True)
class PodRequest:
    """The pod-level shorthands, read; None where absent or wrong."""

    fraction: Decimal | None
    fraction_text: str | None  # gpu-fraction as written, when present (valid or not)
    fraction_limit: Decimal | None
    memory_mib: int | None
    memory_limit: Amount | None
    num_devices: int
    mode: ComputeMode | None


def _read_memory_limit_shorthand(shorthands: Shorthands, memory_mib: int | None) -> tuple[Amount | None,
                                                                                        list[Violation]]:
    text = shorthands.get(ann.MEMORY_LIMIT)
    if text is None:
        return None, []
    if shorthands.get(ann.MEMORY) is None:
        return None, [annotation(ann.MEMORY_LIMIT, text, f"can only be used together with the {ann.MEMORY} annotation")]
    if memory_mib is None:
        return None, []  # gpu-memory is wrong, and reported
    return read_memory_limit(text, memory_mib)


def read_pod_request(shorthands: Shorthands) -> tuple[PodRequest, list[Violation]]:
    out: list[Violation] = []
    fraction = memory_mib = fraction_limit = num_devices = mode = None
    if (text := shorthands.get(ann.FRACTION)) is not None:
        fraction, problems = read_fraction(ann.FRACTION, text)
        out += problems
    if (text := shorthands.get(ann.MEMORY)) is not None:
        memory_mib, problems = read_memory_mib(text)
        out += problems
    if (text := shorthands.get(ann.FRACTION_LIMIT)) is not None:
        fraction_limit, problems = read_portion_limit(ann.FRACTION_LIMIT, text, fraction,
                                                      shorthands.get(ann.FRACTION))
        out += problems
    memory_limit, problems = _read_memory_limit_shorthand(shorthands, memory_mib)
    out += problems
    if (text := shorthands.get(ann.NUM_DEVICES)) is not None:
        num_devices, problems = read_num_devices(text)
        out += problems
    if (text := shorthands.get(ann.COMPUTE_MODE)) is not None:
        mode, problems = read_mode(ann.COMPUTE_MODE, text)
        out += problems
    return PodRequest(fraction, shorthands.get(ann.FRACTION), fraction_limit, memory_mib, memory_limit,
                      num_devices or 1, mode), out


# --- Translation: what KAI's admission writes for the shorthands (nvfractions/mutation.go), and so gpufrac ------


def translate(shorthands: Shorthands, request: PodRequest, target: Target) -> ContainerKeys | None:
    """The target's per-container fields for the shorthands, in KAI's strings: gpu-memory N as the canonical
    quantity of `<N>Mi` (2048 -> `2Gi`), gpu-memory.limit and gpu-fraction.limit verbatim. Only valid values are
    translated."""
    if target.container is None:
        return None
    fields: dict[str, str] = {}
    if request.memory_mib is not None:
        fields[Field.MEMORY_REQUEST] = mebibytes(request.memory_mib)
    if request.memory_limit is not None:
        fields[Field.MEMORY_LIMIT] = request.memory_limit.text
    if request.fraction_limit is not None:
        fields[PORTION_LIMIT] = shorthands.values[ann.FRACTION_LIMIT]
    if request.mode is not None:
        fields[Field.COMPUTE_MODE] = shorthands.values[ann.COMPUTE_MODE]
    return ContainerKeys(target.container, fields) if fields else None


# The shorthand each translated field comes from.
_SOURCE_OF: dict[str, str] = {Field.MEMORY_REQUEST: ann.MEMORY, Field.MEMORY_LIMIT: ann.MEMORY_LIMIT,
                              PORTION_LIMIT: ann.FRACTION_LIMIT, Field.COMPUTE_MODE: ann.COMPUTE_MODE}


# --- Rules on the whole pod -------------------------------------------------------------------------------------


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
    """With pod-level shorthands, the per-container keys name the container they apply to. KAI moves the
    shorthands to the container the keys name, but its portion-limit check and gpufrac read the first container;
    gpufrac asks for the name rather than guess (KAI: "... does not match container name ...")."""
    targeting = shorthands.targeting()
    if not targeting or target.container is None:
        return []
    out = []
    for name in sorted(keys.keys() - {target.container}):
        for key, value in keys[name].items():
            if target.explicit:
                problem = (f"names container {name}, but {ann.CONTAINER_NAME} is {target.container}; the fraction "
                           "annotations of a pod name one container")
            else:
                problem = (f"names container {name}, but {targeting[0]} applies to {target.container}; set "
                           f"{ann.CONTAINER_NAME} to {name}")
            out.append(annotation(key, value, problem))
    return out


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


# --- Each container's keys, read ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerRequest:
    """What one container's keys (written, or translated from the shorthands) ask for; None where absent or wrong."""

    keys: ContainerKeys
    request: Amount | None
    limit: Amount | None
    mode: ComputeMode | None
    devices: tuple[str, ...]
    portion_limit: Decimal | None
    asks_memory: bool  # a memory key is present, valid or not


def read_container_request(keys: ContainerKeys, request: PodRequest,
                           translated: Mapping[str, str]) -> tuple[ContainerRequest, list[Violation]]:
    """Reads one container's keys. A translated value was judged as its shorthand, so only written ones report."""
    out: list[Violation] = []
    found: dict[str, Any] = {}
    for name, text in keys.fields.items():
        key = keys.key(name)
        if name in (Field.MEMORY_REQUEST, Field.MEMORY_LIMIT):
            found[name], problems = read_amount(key, text)
        elif name == Field.COMPUTE_MODE:
            found[name], problems = read_mode(key, text)
        elif name == Field.DEVICES:
            found[name], problems = read_devices(key, text)
        else:
            found[name], problems = read_portion_limit(key, text, request.fraction, request.fraction_text)
        out += [] if key in translated else problems
    memory_fields = {Field.MEMORY_REQUEST, Field.MEMORY_LIMIT} & keys.fields.keys()
    return ContainerRequest(keys, found.get(Field.MEMORY_REQUEST), found.get(Field.MEMORY_LIMIT),
                            found.get(Field.COMPUTE_MODE), found.get(Field.DEVICES) or (), found.get(PORTION_LIMIT),
                            bool(memory_fields)), out


def merged_keys(keys: dict[str, ContainerKeys], translation: ContainerKeys | None) -> dict[str, ContainerKeys]:
    """The per-container keys once the translation is written (what is already there stays)."""
    merged = dict(keys)
    if translation is not None:
        written = keys[translation.container].fields if translation.container in keys else {}
        merged[translation.container] = ContainerKeys(translation.container, {**translation.fields, **written})
    return merged


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
        if Field.DEVICES in entry.keys.fields:
            out.append(annotation(entry.keys.key(Field.DEVICES), entry.keys.fields[Field.DEVICES],
                                  f"is set, but container {name} asks for no GPU fraction"))
    return out


def rule_compute_mode_shorthand_needs_a_fraction(shorthands: Shorthands, fractional: set[str]) -> list[Violation]:
    text = shorthands.get(ann.COMPUTE_MODE)
    if text is None or fractional:
        return []
    return [annotation(ann.COMPUTE_MODE, text, f"needs a fraction to apply to: {ann.FRACTION}, {ann.MEMORY} or "
                                               "nvidia.com/container.<c>.gpu-memory.request")]


# --- From requests to fractions ------------------------------------------------------------------------------------


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
        )
    return result


# --- Rules on the fractions ---------------------------------------------------------------------------------------


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
    return _keys(fraction.container if name is None else name, _has_portion_limit(fraction))


def _has_portion_limit(fraction: ContainerFraction) -> bool:
    return fraction.portion is not None and fraction.portion.limit is not None


def _keys(name: str, portion_limit: bool) -> list[str]:
    keys = [ann.canonical_key(name, f) for f in ann.CanonicalField]
    keys += [ann.nvidia_key(name, f) for f in (Field.MEMORY_REQUEST, Field.MEMORY_LIMIT, Field.DEVICES)]
    if portion_limit:
        keys.append(ann.portion_limit_key(name))
    return keys


@functools.cache  # two possible answers
def _longest_key(portion_limit: bool) -> tuple[int, int]:
    """(position in `_keys`, length of its name part less the container name) of the key with the longest rest:
    the keys differ only in the container name, so that one decides how long a name may be."""
    rests = [ann.key_name_length(k) for k in _keys("", portion_limit)]
    longest = max(rests)
    return rests.index(longest), longest


def rule_name_fits_the_keys(fraction: ContainerFraction) -> list[Violation]:
    """The container name is part of each key, whose name part Kubernetes caps at 63 characters."""
    name = fraction.container
    if not ann.is_container_name(name):
        return [Violation(f"container {name}", "has a name that cannot be part of an annotation key (a lowercase "
                                               "DNS-1123 label is needed); rename it")]
    position, rest = _longest_key(_has_portion_limit(fraction))
    allowed = ann.KEY_NAME_MAX - rest
    if len(name) <= allowed:
        return []
    key = keys_for(fraction)[position]
    return [Violation(f"container {name}", f"has a name longer than {allowed} characters, too long for the annotation "
                                           f"key {key} (at most {ann.KEY_NAME_MAX} characters after the /); shorten "
                                           "it")]


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
    return read_target(read_shorthands(annotations), containers)[0].container


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
    return PodFractions(dict(fractions.containers), dict(fractions.translated)), violations


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
    target = review.add(read_target(shorthands, containers))
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
    requests = {name: review.add(read_container_request(entry, request, translated))
                for name, entry in merged.items()}
    fractions = build_fractions(requests, request, target, containers)
    review.violations += [*rule_request_within_limit(requests),
                          *rule_mode_and_devices_need_a_fraction(requests, request, target, set(fractions), translated),
                          *rule_compute_mode_shorthand_needs_a_fraction(shorthands, set(fractions)),
                          *rule_one_fraction_container(fractions, allow_multiple),
                          *rule_one_compute_mode(fractions)]
    for fraction in fractions.values():
        review.violations += [*rule_devices_follow_the_request(fraction), *rule_name_fits_the_keys(fraction)]
    return PodFractions(fractions, {k: v for k, v in translated.items() if k not in annotations}), review.violations
