"""`make bench`'s tax section (bench/admission_tax.py) in its smallest form (`make bench`'s smoke mode), through a real
kube-apiserver: every cell has its requests, each costs the API server CPU, the fractional pods come back mutated
exactly where gpufrac is installed, and the report names every cell and the issue's targets. No timing is asserted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import admission_tax, fraction_floor
from bench.__main__ import MODES
from bench.admission_tax import (
    DEFAULTS,
    FLOOR,
    FRACTION_FLOORS,
    KINDS,
    LABEL_GATE,
    NOTHING,
    PLAIN_KINDS,
    POLICIES_OFF,
    SETUPS,
    TARGETS,
)
from e2e.toolkit.errors import ToolsMissingError
from e2e.toolkit.tools import Tools

pytestmark = pytest.mark.timeout(600)


def test_every_request_kind_is_measured_under_every_setup(tmp_path: Path) -> None:
    try:
        Tools.find()
    except ToolsMissingError as err:
        pytest.skip(f"no kube-apiserver to measure (make tools): {err}")
    smoke = MODES["smoke"]
    result = admission_tax.run(requests=smoke["tax_requests"], rounds=smoke["tax_rounds"], workdir=tmp_path / "cp",
                               idle_s=0.5)
    assert not isinstance(result, str), result
    assert set(result.cells) == ({(s, k) for s in SETUPS for k in KINDS} | {(FLOOR, k) for k in PLAIN_KINDS}
                                 | {(s, "fractional CREATE") for s in FRACTION_FLOORS})
    for (setup, kind), cell in result.cells.items():
        assert cell.errors == 0, (setup, kind, cell.first_error)
        assert len(cell.latencies) == smoke["tax_requests"] * smoke["tax_rounds"], (setup, kind)
        assert cell.cpu_ms > 0, (setup, kind, cell.cpu_seconds)  # the API server did work for each request
        assert cell.wrong == 0, (setup, kind, cell.mutated)
    for setup in (DEFAULTS, POLICIES_OFF, LABEL_GATE):  # gpufrac's mutating webhook labels every fractional pod
        cell = result.cells[(setup, "fractional CREATE")]
        assert cell.mutated == len(cell.latencies), setup
    assert result.cells[(NOTHING, "fractional CREATE")].mutated == 0  # nothing installed: stored as sent
    # A plain pod's CREATE and status write are each kept out by one gate (the mutating webhook's conditions, the
    # status policy's), timed by the API server; with nothing installed no gate runs.
    for kind in PLAIN_KINDS:
        assert result.cells[(DEFAULTS, kind)].gated == len(result.cells[(DEFAULTS, kind)].latencies), kind
        assert result.cells[(DEFAULTS, kind)].gate_ms > 0, kind
        assert result.cells[(NOTHING, kind)].gated == 0, kind
        # The floor: nothing of gpufrac's, one empty gate per plain kind, timed once per request, and gone after.
        assert result.cells[(FLOOR, kind)].gated == len(result.cells[(FLOOR, kind)].latencies), kind
        assert result.cells[(FLOOR, kind)].gate_ms > 0, kind
        assert f"| {kind} | {FLOOR} | {result.server_version} | " in admission_tax.markdown(result), kind
    # Issue 47: with the label gate on, a plain unlabelled pod meets no gate and calls no webhook, as with nothing
    # installed (the objectSelector is decided on labels, before any CEL), while the labelled fractional pods are
    # still mutated and their binds judged by the webhook.
    for kind in PLAIN_KINDS:
        assert result.cells[(LABEL_GATE, kind)].gated == 0, kind
        assert result.cells[(LABEL_GATE, kind)].called == 0, kind
        assert result.cells[(NOTHING, kind)].called == 0, kind
    # Issue 47's fraction floors: gpufrac's additions made with nothing of it installed. Every pod is stored
    # carrying them (the mark counted from each answer), sent so or written by the constant policy or webhook; no
    # gate is evaluated, and only the constant webhook is called, once per pod.
    for setup in FRACTION_FLOORS:
        cell = result.cells[(setup, "fractional CREATE")]
        assert cell.mutated == len(cell.latencies), setup
        calls = len(cell.latencies) if setup in (fraction_floor.WEBHOOK, fraction_floor.WEBHOOK_METADATA) else 0
        assert cell.called == calls and cell.gated == 0, (setup, cell.called)
    binds = result.cells[(LABEL_GATE, "binder UPDATE")]
    assert binds.called >= len(binds.latencies)
    text = admission_tax.markdown(result)
    version = result.server_version
    assert version.startswith("v1."), version
    for setup in SETUPS:
        for kind in KINDS:
            assert f"| {kind} | {setup} | {version} | " in text, (setup, kind)
    for kind in TARGETS:  # the target and whether the run met it, on the defaults row
        assert re.search(rf"^\| {kind} \| {DEFAULTS} \| .* \| (yes|\*\*no\*\*)( \(median: (yes|no)\))? \|$", text,
                         re.M), kind
    assert f"load average {result.machine['load']} before" in text
    assert "per plain request under the defaults: plain CREATE " in text
    assert f"{FLOOR}, one condition `false`: " in text
    assert (f"made without gpufrac, Kubernetes {version}, × nothing: {fraction_floor.STORED} ×" in text
            and f"; {fraction_floor.POLICY} ×" in text and f"; {fraction_floor.WEBHOOK} ×" in text), text
    assert f"{LABEL_GATE} (gpufrac.io/fractions=true selects; plain pods unlabelled), Kubernetes {version}: " in text
