"""hack/file_lines.py, `make lint`'s check that no file in gpufrac/ is above 500 lines: it names each longer file
with its count, passes at the limit, skips generated stubs, and refuses a directory that is not there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "file_lines.py"


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_a_file_above_the_limit_is_named_with_its_count(tmp_path):
    (tmp_path / "pkg" / "generated").mkdir(parents=True)
    (tmp_path / "pkg" / "at_limit.py").write_text("x = 1\n" * 5)
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * 6)
    (tmp_path / "pkg" / "generated" / "stub_pb2.py").write_text("x = 1\n" * 50)
    res = check("--max", "5", str(tmp_path / "pkg"))
    assert res.returncode == 1
    assert res.stdout.splitlines() == [f"{tmp_path / 'pkg' / 'long.py'}: 6 lines (at most 5: split it by job)"]


def test_files_at_the_limit_pass(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n" * 5)
    res = check("--max", "5", str(tmp_path))
    assert (res.returncode, res.stdout) == (0, "")


def test_a_missing_directory_is_a_one_line_error(tmp_path):
    res = check("--max", "5", str(tmp_path / "nowhere"))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == f"hack/file_lines.py: error: not a directory: {tmp_path / 'nowhere'}"
