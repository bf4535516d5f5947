"""Kubernetes resource quantities and the decimal numbers fraction annotations use, parsed strictly.

`canonical_quantity` writes a quantity the way Kubernetes' `resource.Quantity.String()` does (apimachinery
`pkg/api/resource/quantity.go`: ParseQuantity, then CanonicalizeBytes), because KAI compares the strings it writes
with the ones already on a pod: `2048Mi` is written `2Gi`.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from decimal import ROUND_CEILING, Context, Decimal, DecimalException
from enum import Enum

_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}  # power of two
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}  # power of ten
_BINARY_SUFFIX = {power: suffix for suffix, power in _BINARY.items()} | {0: ""}
_DECIMAL_SUFFIX = {power: suffix for suffix, power in _DECIMAL.items()}
# The grammar of resource.Quantity: sign, digits with one optional point, then one suffix. `E` alone is exa;
# `E` or `e` followed by digits is a power of ten.
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<num>[0-9]*)(?:\.(?P<denom>[0-9]*))?"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+|[numkMGTPE])?$"
)
# A decimal number as users write fractions: `0.25`, `.5`, `+0.5`, `2.5e-1`. Go's strconv.ParseFloat (what KAI
# reads them with) takes these too; NaN, infinities, hex and underscores it also takes are refused here.
DECIMAL_NUMBER_PATTERN = r"^\+?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?$"
_DECIMAL_NUMBER = re.compile(DECIMAL_NUMBER_PATTERN)
_WHOLE_NUMBER = re.compile(r"^[0-9]+$")  # strconv.ParseUint, base 10: digits only, no sign
_SIGNED_WHOLE_NUMBER = re.compile(r"^[+-]?[0-9]+$")  # strconv.ParseInt, base 10
_MAX_LEN = 64  # nothing legitimate is longer; bounding it keeps Decimal work trivial on hostile input
_MAX_EXPONENT = 10_000  # far past any memory size, and keeps the canonical form's integers small
_MAX_INT64 = (1 << 63) - 1
_NANO = Decimal("1e-9")
# Every digit of a 64-character quantity times 2**60, exactly; rounding (to 1e-9) away from zero, as ParseQuantity.
_EXACT = Context(prec=200, rounding=ROUND_CEILING)


class QuantityError(ValueError):
    """A value that is not a well-formed number or quantity."""


class QuantityFormat(Enum):
    """How a quantity's suffix says it is to be written back (resource.Format)."""

    BINARY_SI = "BinarySI"
    DECIMAL_SI = "DecimalSI"
    DECIMAL_EXPONENT = "DecimalExponent"


@dataclass(frozen=True)
class Quantity:
    """A parsed quantity: its exact value (bytes, for memory), how it is written back, and the text it came from."""

    value: Decimal
    format: QuantityFormat
    text: str
    has_unit: bool  # `4096Mi`, `1E`; not a bare number (`4096`) or a power of ten (`4e3`)


def _match(text: str) -> re.Match[str]:
    match = _QUANTITY.fullmatch(text) if 0 < len(text) <= _MAX_LEN else None
    if match is None or (match["num"] == "" and match["denom"] is None):
        raise QuantityError(text)
    return match


def _power(suffix: str) -> tuple[int, int, QuantityFormat]:
    """(base, exponent, format) of a suffix."""
    if suffix in _BINARY:
        return 2, _BINARY[suffix], QuantityFormat.BINARY_SI
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        exponent = int(suffix[1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError(suffix)
        return 10, exponent, QuantityFormat.DECIMAL_EXPONENT
    return 10, _DECIMAL[suffix], QuantityFormat.DECIMAL_SI


def _round_up_to_nano(value: Decimal) -> Decimal:
    """ParseQuantity rounds a non-zero value away from zero to the nearest 1e-9."""
    exponent = value.as_tuple().exponent
    if isinstance(exponent, int) and exponent >= -9:
        return value  # already a whole number of nano units
    magnitude = _EXACT.quantize(abs(value), _NANO)
    return -magnitude if value < 0 else magnitude


@functools.lru_cache(maxsize=1024)  # pure, and the same few values come in review after review
def parse(text: str) -> Quantity:
    """A Kubernetes quantity (`40Gi`, `1000M`, `1.5e9`, `1E`), exactly as resource.ParseQuantity reads it."""
    match = _match(text)
    base, exponent, quantity_format = _power(match["suffix"] or "")
    try:
        number = Decimal(f"{match['sign']}{match['num'] or '0'}.{match['denom'] or '0'}")
        value = _EXACT.multiply(number, 1 << exponent) if base == 2 else _EXACT.scaleb(number, exponent)
        value = _round_up_to_nano(value) if value else Decimal(0)
    except (DecimalException, ValueError, OverflowError) as exc:  # e.g. Overflow on huge exponents
        raise QuantityError(text) from exc
    if quantity_format is QuantityFormat.BINARY_SI and value > _MAX_INT64:
        value = Decimal(_MAX_INT64)  # ParseQuantity caps binary quantities at the int64 maximum
    has_unit = quantity_format is not QuantityFormat.DECIMAL_EXPONENT and bool(match["suffix"])
    return Quantity(value, quantity_format, text, has_unit)


def parse_quantity(text: str) -> Decimal:
    """The value of a Kubernetes quantity, in base units (bytes for memory)."""
    return parse(text).value


def has_unit(text: str) -> bool:
    """Whether a well-formed quantity names its unit (`4096Mi`, `1E`), rather than being a bare number (`4096`,
    `4e3`): KAI refuses what strconv.ParseFloat reads for `gpu-memory.limit`."""
    try:
        return parse(text).has_unit
    except QuantityError:
        return False


def _reuses_text(text: str) -> bool:
    """ParseQuantity keeps the text, and String() returns it unchanged, when it is already in a canonical shape
    (its fast path: an int64 mantissa, no fraction digits for binary suffixes; then the checks it makes)."""
    match = _match(text)
    num = (match["num"] or "").lstrip("0") or "0"  # parseQuantityString strips leading zeros, keeps one
    denom = match["denom"] or ""
    _, exponent, quantity_format = _power(match["suffix"] or "")
    if text == "0":
        return True
    if quantity_format is QuantityFormat.BINARY_SI:
        precision = 15 - len(num) - int(exponent * 3 / 10) - 1
        if denom or precision < 0 or int(num) << exponent > _MAX_INT64:
            return False
        return exponent % 10 == 0 and int(num) & 0x07 != 0
    shifted = num + denom
    if 18 - len(shifted) < 0 or exponent - len(denom) < -9 or int(shifted) > _MAX_INT64:
        return False
    return (exponent - len(denom)) % 3 == 0 and not shifted.endswith("000") and shifted[0] != "0"


def _without_factors(value: int, base: int) -> tuple[int, int]:
    count = 0
    while value and value % base == 0:
        value //= base
        count += 1
    return value, count


def _decimal_canonical(value: Decimal, quantity_format: QuantityFormat) -> str:
    """AsCanonicalBytes: an integer mantissa and a power of ten that is a multiple of 3, then its suffix."""
    sign, digits, exponent = value.as_tuple()
    mantissa, factors = _without_factors(int("".join(map(str, digits))), 10)
    exponent = int(exponent) + factors  # finite: parse never returns NaN or infinity
    while exponent % 3:
        mantissa *= 10
        exponent -= 1
    number = f"{'-' if sign else ''}{mantissa}"
    if quantity_format is QuantityFormat.DECIMAL_EXPONENT or exponent not in _DECIMAL_SUFFIX:
        return number + (f"e{exponent}" if exponent else "")
    return number + _DECIMAL_SUFFIX[exponent]


def canonical_quantity(text: str) -> str:
    """The quantity as Kubernetes writes it back (resource.Quantity.String()): `2048Mi` -> `2Gi`, `1.5Gi` ->
    `1536Mi`, `0.5Gi` -> `512Mi`, `1000M` -> `1G`, `1100k` -> `1100k`, `1e3` -> `1e3`."""
    quantity = parse(text)
    if _reuses_text(text):
        return text
    value, quantity_format = quantity.value, quantity.format
    if value == 0:
        return "0"
    if quantity_format is QuantityFormat.BINARY_SI:
        if -1024 < value < 1024 or value != value.to_integral_value():
            quantity_format = QuantityFormat.DECIMAL_SI  # shown in decimal rather than rounded
        else:
            amount, times = _without_factors(abs(int(value)), 1024)  # at most 6: values stop at the int64 cap
            return f"{'-' if value < 0 else ''}{amount}{_BINARY_SUFFIX[10 * times]}"
    return _decimal_canonical(value.normalize(), quantity_format)


def mebibytes(count: int) -> str:
    """`<count>Mi` in canonical form, as KAI writes a translated `gpu-memory` (2048 -> `2Gi`)."""
    return canonical_quantity(f"{count}Mi")


@functools.lru_cache(maxsize=1024)
def parse_decimal(text: str) -> Decimal:
    """A non-negative decimal number in plain or scientific notation, with an optional `+`; nothing else."""
    if len(text) > _MAX_LEN or not _DECIMAL_NUMBER.fullmatch(text):
        raise QuantityError(text)
    return Decimal(text.removeprefix("+"))


def as_binary64(text: str) -> float:
    """The number as strconv.ParseFloat(text, 64) reads it, which is what KAI's scheduler and binder see."""
    number = float(parse_decimal(text))
    if math.isinf(number):
        raise QuantityError(text)
    return number


def plain(value: Decimal) -> str:
    """A decimal written without an exponent: `812345e-6` -> `0.812345`."""
    return f"{value.normalize():f}"


def decimals_after_point(value: Decimal) -> int:
    """Digits after the point of the number written plainly (`8.5e-1` -> 2)."""
    exponent = value.normalize().as_tuple().exponent
    return max(0, -int(exponent)) if isinstance(exponent, int) else 0


def characters_after_point(text: str) -> int:
    """What KAI counts for a portion limit's precision: every character after the first `.` of the text."""
    _, point, rest = text.partition(".")
    return len(rest) if point else 0


def parse_whole_number(text: str, *, signed: bool = False) -> int:
    """A base-10 integer as strconv.ParseUint (or ParseInt, `signed`) takes it: digits, leading zeros allowed."""
    pattern = _SIGNED_WHOLE_NUMBER if signed else _WHOLE_NUMBER
    if len(text) > _MAX_LEN or not pattern.fullmatch(text):
        raise QuantityError(text)
    return int(text)
