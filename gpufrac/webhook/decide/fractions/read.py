"""Readers, one per source (the pod's containers, the pod-level shorthands, the per-container keys, the
container the shorthands apply to) and one per value: each reads one annotation and says what is wrong with it.
Also what KAI's admission writes for the shorthands (nvfractions/mutation.go), and so gpufrac (`translate`)."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import ComputeMode, Field
from gpufrac.core.contract import MIB
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
from gpufrac.webhook.decide import pod as podview
from gpufrac.webhook.decide.errors import Violation, annotation
from gpufrac.webhook.decide.fractions.model import (
    COMPUTE_PORTION_RANGE,
    DEVICES_LIST,
    FRACTION_RANGE,
    MAX_DEVICES,
    MAX_MIB,
    MEMORY_QUANTITY,
    PORTION_DIGITS,
    PORTION_LIMIT,
    WHOLE_MIB,
    Amount,
    ContainerKeys,
    ContainerRequest,
    Containers,
    PodRequest,
    Shorthands,
    Target,
)


def read_containers(obj: dict[str, Any]) -> Containers:
    refs = list(podview.containers(obj, podview.ContainerKind.CONTAINER, podview.ContainerKind.INIT))
    regular = [r.name for r in refs if r.kind is podview.ContainerKind.CONTAINER]
    return Containers(tuple(r.name for r in refs), regular[0] if regular else None)


def read_shorthands(annotations: Mapping[str, str]) -> Shorthands:
    return Shorthands({key: annotations[key] for key in ann.SHORTHAND_KEYS if key in annotations})


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


def keyed_container(keys: Mapping[str, ContainerKeys]) -> str | None:
    """The container the `nvidia.com/container.` keys name, when they all name one (KAI: GetNvFractionsContainerName;
    `kai.scheduler/container.` portion limits do not count)."""
    named = {name for name, entry in keys.items() if any(f != PORTION_LIMIT for f in entry.fields)}
    return named.pop() if len(named) == 1 else None


def read_target(shorthands: Shorthands, containers: Containers,
                keys: Mapping[str, ContainerKeys]) -> tuple[Target, list[Violation]]:
    name = shorthands.get(ann.CONTAINER_NAME)
    if name is None:
        return Target(keyed_container(keys) or containers.first, explicit=False), []
    if name not in containers.names:
        return Target(None, explicit=True), [annotation(ann.CONTAINER_NAME, name, "must name a container of the "
                                                        f"pod: {containers.listing()}")]
    return Target(name, explicit=True), []


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
        return (), [annotation(key, text, f"{DEVICES_LIST} (bad entry: {exc})")]


def read_compute_portion(key: str, text: str) -> tuple[float | None, list[Violation]]:
    """The scheduler's compute portion, as KAI's binder writes it (strconv.FormatFloat of a portion in (0, 1]) and as
    the node reads it (binary64); a percentage (50), a quantity (500m), NaN or Inf is not one."""
    try:
        reading = as_binary64(text)
    except QuantityError:
        return None, [annotation(key, text, COMPUTE_PORTION_RANGE)]
    if not 0 < reading <= 1:
        return None, [annotation(key, text, COMPUTE_PORTION_RANGE)]
    return reading, []


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
        elif name == Field.COMPUTE_PORTION:
            found[name], problems = read_compute_portion(key, text)
        else:
            found[name], problems = read_portion_limit(key, text, request.fraction, request.fraction_text)
        out += [] if key in translated else problems
    memory_fields = {Field.MEMORY_REQUEST, Field.MEMORY_LIMIT} & keys.fields.keys()
    return ContainerRequest(keys, found.get(Field.MEMORY_REQUEST), found.get(Field.MEMORY_LIMIT),
                            found.get(Field.COMPUTE_MODE), found.get(Field.DEVICES) or (), found.get(PORTION_LIMIT),
                            bool(memory_fields), found.get(Field.COMPUTE_PORTION)), out


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


def merged_keys(keys: dict[str, ContainerKeys], translation: ContainerKeys | None) -> dict[str, ContainerKeys]:
    """The per-container keys once the translation is written (what is already there stays)."""
    merged = dict(keys)
    if translation is not None:
        written = keys[translation.container].fields if translation.container in keys else {}
        merged[translation.container] = ContainerKeys(translation.container, {**translation.fields, **written})
    return merged
