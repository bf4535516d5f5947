"""`make bench` runs: its quickest mode prints the report and writes it. No timing is asserted, anywhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_smoke_prints_the_report_and_writes_it(tmp_path):
    out = tmp_path / "results.md"
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--skip", "apiserver", "--skip", "nri", "--no-install",
         "--out", str(out), "--workdir", str(tmp_path / "work")],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    report = result.stdout
    for heading in ("# gpufrac benchmarks (smoke)", "## 1. Admission over HTTPS, direct",
                    "## 2. Admission through kube-apiserver", "## 3. In-process decision path", "## 4. Node agent",
                    "## Appendix: profile of the decision path"):
        assert heading in report
    assert "| containers | annotations | fractional containers |" in report
    assert "| 50 | 64 |" in report
    assert "Python 3." in report
    assert out.read_text() == report
