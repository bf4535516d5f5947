"""The NRI section's latency summary (bench/nri_create.py): p95 by nearest rank, never below the median."""

from __future__ import annotations

from bench.nri_create import _summary


def test_p95_of_two_creations_is_the_slower_one():
    summary = _summary([0.010, 0.015])
    assert (summary["p50_ms"], summary["p95_ms"]) == (12.5, 15.0)


def test_p95_of_120_creations_is_the_114th_as_published():
    assert _summary([i / 1000 for i in range(120, 0, -1)])["p95_ms"] == 114.0


def test_p95_of_ten_creations_is_the_slowest():
    # ceil(9.5) = 10th: 95 % of ten samples are not at or below the 9th (a floor of 0.95 (n - 1) would pick it)
    assert _summary([i / 1000 for i in range(1, 11)])["p95_ms"] == 10.0
