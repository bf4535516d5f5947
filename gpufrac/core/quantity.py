"""Kubernetes resource quantities and the decimal numbers fraction annotations use, parsed strictly."""

from __future__ import annotations

import re
from decimal import Decimal, DecimalException

_BINARY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
            "P": Decimal("1e15"), "E": Decimal("1e18")}
# The grammar of k8s.io/apimachinery resource.Quantity: sign, digits with one optional point, then one suffix.
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
# A plain decimal number as users write portions: `0.25`, `.5`, `2.5e-1`. No sign, hex, inf or NaN.
_DECIMAL_NUMBER = re.compile(r"^(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?$")
_MAX_LEN = 64  # nothing legitimate is longer; bounding it keeps Decimal work trivial on hostile input


class QuantityError(ValueError):
    """A value that is not a well-formed number or quantity."""


def parse_quantity(text: str) -> Decimal:
    """The value of a Kubernetes quantity (`40Gi`, `1000M`, `1.5e9`), in base units (bytes for memory)."""
    match = _QUANTITY.fullmatch(text) if len(text) <= _MAX_LEN else None
    if match is None:
        raise QuantityError(text)
    suffix = match["suffix"] or ""
    try:
        number = Decimal(match["num"])
        if suffix in _BINARY:
            return number * _BINARY[suffix]
        if suffix[:1] in ("e", "E"):
            return number.scaleb(int(suffix[1:]))
        return number * _DECIMAL[suffix]
    except (DecimalException, ValueError, OverflowError) as exc:  # e.g. Overflow on 1e1000000
        raise QuantityError(text) from exc


def has_unit(text: str) -> bool:
    """Whether a well-formed quantity names its unit (`4096Mi`), rather than being a bare number (`4096`)."""
    match = _QUANTITY.fullmatch(text)
    return bool(match and match["suffix"] and match["suffix"][:1] not in ("e", "E"))


def parse_decimal(text: str) -> Decimal:
    """A non-negative decimal number in plain or scientific notation, nothing else."""
    if len(text) > _MAX_LEN or not _DECIMAL_NUMBER.fullmatch(text):
        raise QuantityError(text)
    return Decimal(text)


def decimals_after_point(text: str) -> int:
    """Digits after the point of a plain decimal, the precision KAI caps portion limits at."""
    value = parse_decimal(text)
    exponent = value.normalize().as_tuple().exponent
    return max(0, -int(exponent)) if isinstance(exponent, int) else 0
