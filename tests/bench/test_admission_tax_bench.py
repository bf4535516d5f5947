"""`make bench`'s tax section (bench/admission_tax.py) in its smallest form, through a real kube-apiserver: every cell
has its requests, each costs the API server CPU, the fractional pods come back mutated exactly where gpufrac is
installed, and the report names every cell and the issue's targets."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import admission_tax
from e2e.toolkit.errors import ToolsMissingError
from e2e.toolkit.tools import Tools

pytestmark = pytest.mark.timeout(600)


def test_every_request_kind_is_measured_under_every_setup(tmp_path: Path) -> None:
    try:
        Tools.find()
    except ToolsMissingError as err:
        pytest.skip(f"no kube-apiserver to measure (make tools): {err}")
    result = admission_tax.run(requests=3, rounds=1, workdir=tmp_path / "cp")
    assert not isinstance(result, str), result
    assert set(result.cells) == {(s, k) for s in admission_tax.SETUPS for k in admission_tax.KINDS}
    for cell in result.cells.values():
        assert cell.errors == 0, (cell.setup, cell.kind, cell.first_error)
        assert len(cell.latencies) == 3 and cell.cpu_seconds >= 0, (cell.setup, cell.kind)
        assert cell.wrong == 0, (cell.setup, cell.kind)  # mutated under gpufrac, as sent under nothing
    # the API server did work for these requests (a CPU clock that never moved would give 0 everywhere)
    assert sum(cell.cpu_seconds for cell in result.cells.values()) > 0
    text = admission_tax.markdown(result)
    for setup in admission_tax.SETUPS:
        for kind in admission_tax.KINDS:
            assert f"| {kind} | {setup} |" in text
    assert text.count("| yes |") + text.count("| **no** |") == len(admission_tax.TARGETS)
