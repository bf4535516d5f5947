"""Quantities as Kubernetes reads and writes them (apimachinery pkg/api/resource: ParseQuantity, Quantity.String)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpufrac.core.quantity import (
    QuantityError,
    as_binary64,
    canonical_quantity,
    characters_after_point,
    has_unit,
    mebibytes,
    parse_quantity,
    parse_whole_number,
)


@pytest.mark.parametrize(("text", "canonical"), [
    # Canonicalized: binary amounts by the largest power of 1024 that divides them, decimal ones by a power of
    # ten that is a multiple of 3.
    ("2048Mi", "2Gi"), ("1024Ki", "1Mi"), ("1.5Gi", "1536Mi"), ("0.5Gi", "512Mi"), ("1Gi", "1Gi"),
    ("1048576Mi", "1Ti"), ("1000M", "1G"), ("1.1e3", "1100"), ("0.1", "100m"), ("1.5", "1500m"),
    ("0.001Ki", "1024m"), ("02048Mi", "2Gi"), ("1073741824", "1073741824"), ("1e9", "1e9"), ("0", "0"),
    ("0Mi", "0"), ("1024", "1024"),
    # Kept as written: the shapes ParseQuantity recognises as canonical already (and so String() returns).
    ("2000Mi", "2000Mi"), ("1025Ki", "1025Ki"), ("1500M", "1500M"), ("100m", "100m"), ("1E", "1E"),
    ("3Ei", "3Ei"), ("+1500M", "+1500M"), ("01Ki", "01Ki"),
])
def test_canonical_form_is_what_kubernetes_writes(text, canonical):
    assert canonical_quantity(text) == canonical


@pytest.mark.parametrize(("mib", "text"), [(2048, "2Gi"), (2000, "2000Mi"), (1, "1Mi"), (1024 * 1024, "1Ti"),
                                           (1 << 40, "1Ei"), (3 * 1024, "3Gi"), (71885, "71885Mi")])
def test_mebibytes_as_kai_writes_a_translated_gpu_memory(mib, text):
    assert mebibytes(mib) == text


@pytest.mark.parametrize(("text", "value"), [("1E", 10**18), ("1Ei", 2**60), ("3Ei", 3 * 2**60), ("1.5Gi", 3 * 2**29),
                                             ("1e3", 1000), ("1E3", 1000), ("2047999Ki", 2047999 * 1024),
                                             ("1n", Decimal("1e-9")), ("0.0000000001", Decimal("1e-9"))])
def test_values_are_exact(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize(("text", "unit"), [("1E", True), ("3Ei", True), ("4096Mi", True), ("100m", True),
                                            ("4096", False), ("1e3", False), ("1E3", False), ("0.5", False)])
def test_a_unit_is_what_parse_float_does_not_read(text, unit):
    assert has_unit(text) is unit


@pytest.mark.parametrize("text", ["", "1 Gi", " 1Gi", "1GB", "1e", "Gi", "0x10", "1.2.3", "1Gi ", "NaN", "1" * 65])
def test_malformed_quantities_are_errors(text):
    with pytest.raises(QuantityError):
        parse_quantity(text)
    assert has_unit(text) is False


def test_portions_read_as_binary64_like_parse_float():
    assert as_binary64("1e-400") == 0.0
    assert as_binary64("0.99999999999999999") == 1.0
    assert as_binary64("+0.5") == 0.5
    with pytest.raises(QuantityError):
        as_binary64("1e9999")  # strconv.ParseFloat: out of range


def test_kai_counts_the_characters_after_the_point():
    assert characters_after_point("0.800000") == 6
    assert characters_after_point("812345e-6") == 0
    assert characters_after_point("0.12345e-0") == 8


def test_whole_numbers_as_parse_uint_and_parse_int():
    assert parse_whole_number("02048") == 2048
    assert parse_whole_number("+2", signed=True) == 2
    for bad in ("+2", "2.0", "", " 2", "2e3"):
        with pytest.raises(QuantityError):
            parse_whole_number(bad)
