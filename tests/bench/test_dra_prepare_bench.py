"""`make bench`'s dra section (bench/dra_prepare.py) in its smallest form: the driver's process prepares every claim
through its gRPC socket with a CDI spec, Unprepare removes each, and the figures are measured (no time is asserted,
only that there is one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import dra_prepare
from bench.__main__ import MODES
from bench.report import Report
from gpufrac.agent.dra.decide.claims import read_claim

SMOKE = MODES["smoke"]


def _report() -> Report:
    """A report of no other section (they render `skipped`; the chart is read only by the HTTP section's)."""
    machine = {"date": "d", "cpu": "c", "python": "p", "os": "o", "load": "1.00"}
    return Report("smoke", machine, None, [])  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    workdir = tmp_path_factory.mktemp("dra") / "work"
    return dra_prepare.run(SMOKE["dra_rounds"], SMOKE["dra_claims"], workdir), workdir


def test_the_claims_are_of_both_modes_and_read_as_the_driver_reads_them() -> None:
    [batch] = dra_prepare.claims_for(1, 4)
    devices = [device.device for c in batch for device in read_claim(c).devices]
    assert devices == ["gpu-0-time-slicing", "gpu-1-sm-sharing"] * 2
    assert len({c["metadata"]["uid"] for c in batch}) == 4


def test_every_claim_is_prepared_with_a_spec_and_unprepared(measured: tuple[dict, Path]) -> None:
    result, workdir = measured
    claims = SMOKE["dra_rounds"] * SMOKE["dra_claims"]
    assert claims >= 2 and result["claims"] == claims
    assert result["specs_written"] == result["specs_removed"] == claims
    assert result["prepared_left"] == 0  # the driver's own count when it stopped
    assert list((workdir / "driver" / "cdi").iterdir()) == []  # every spec it wrote is gone
    assert json.loads((workdir / "driver" / "state" / "prepared.json").read_text())["claims"] == []
    assert set(result["by_mode"]) == {"time-slicing", "sm-sharing"}


def test_latencies_and_the_drivers_cpu_are_measured(measured: tuple[dict, Path]) -> None:
    result, _ = measured
    claims = result["claims"]
    for kind, summary in result["calls"].items():
        assert summary["n"] == claims, kind  # one empty call beside each claim's
        assert 0 < summary["p50_ms"] <= summary["p95_ms"], kind
        assert summary["cpu_ms"] > 0, kind  # the driver's process answers even a call naming no claim
    assert result["cpu_ms_per_claim"] > 0 and result["cpu_ms_per_claim_above_floor"] > 0
    assert 0 < result["driver_cpu_ms_in_calls"] <= result["driver_cpu_ms_run"]
    assert len(result["load"]) == len(result["load_before"]) == 3


def test_the_report_renders_the_table(measured: tuple[dict, Path]) -> None:
    result, _ = measured
    report = _report()
    report.dra = result
    text = report.markdown()
    assert "## 6. The DRA driver's Prepare and Unprepare" in text
    assert "| call | calls | p50 ms | p95 ms | mean ms | driver CPU ms / call |" in text
    for row in ("Prepare, 1 claim", "Prepare, 1 claim: sm-sharing", "Prepare, no claim", "Unprepare, 1 claim"):
        assert f"| {row} | {result['claims'] if ':' not in row else result['claims'] // 2} |" in text
    assert f"{result['claims']} of {result['claims']} claims prepared with a CDI spec" in text


def test_a_failed_or_skipped_section_says_so() -> None:
    report = _report()
    assert "skipped (--skip dra)" in report.markdown()
    report.dra = "failed: RuntimeError: Prepare of claim r0-c0 wrote no CDI spec"
    assert "failed: RuntimeError" in report.markdown()
