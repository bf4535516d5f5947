"""zip() of sequences that must be as long as each other, on Python 3.8 (zip's strict= came in 3.10)."""

from __future__ import annotations

from typing import Any


def zip_pairs(first: Any, second: Any) -> list[tuple[Any, Any]]:
    """zip() of two sequences of equal length, without zip's strict= (Python 3.10+)."""
    first, second = list(first), list(second)
    assert len(first) == len(second)
    return [(first[i], second[i]) for i in range(len(first))]


def zip3(first: Any, second: Any, third: Any) -> list[tuple[Any, Any, Any]]:
    return [(a, b, c) for (a, b), c in zip_pairs(zip_pairs(first, second), third)]
