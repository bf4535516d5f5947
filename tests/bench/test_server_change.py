"""`python -m bench.server_change`: the base commit's server and this tree's answer the same load in one run, and
the section says so. No timing is asserted."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.server_change import BASE, HEADING

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (make bench installs it)")
def test_before_and_after_serve_the_same_load_in_one_run():
    if subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", BASE], capture_output=True).returncode != 0:
        pytest.skip(f"this clone does not have the base commit {BASE}")
    result = subprocess.run([sys.executable, "-m", "bench.server_change", "--seconds", "1", "--rounds", "1"],
                            cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    section = result.stdout
    assert HEADING in section and f"Before = the server of {BASE}" in section
    rows = re.findall(r"^\| (\d+) \| (before|after) \| ([\d.]+) \| ([\d.]+) \| [\d.]+ \| [\d,]+ \| (\d+) \|", section,
                      re.M)
    assert [(c, name) for c, name, *_ in rows] == [("1", "before"), ("1", "after"), ("8", "before"), ("8", "after")]
    assert all(float(cpu) > 0 and errors == "0" for *_, cpu, _p50, errors in rows), rows
    assert re.search(r"^- before: [\d.]+(, [\d.]+){4}$", section, re.M)
    assert re.search(r"^- after: [\d.]+(, [\d.]+){4}$", section, re.M)
    assert "Load average at the start:" in section
