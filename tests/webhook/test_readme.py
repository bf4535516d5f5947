"""Every command of the README's `bash lines` blocks (the `gpufrac review` examples) runs as written, from the
repository root, with files that exist, and exits as its comment says."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.docblocks import blocks

ROOT = Path(__file__).resolve().parents[2]
_EXIT = re.compile(r"#\s*exit (\d)\b")


def _review_commands() -> list[tuple[str, int]]:
    commands = []
    for block in blocks("README.md", "lines"):
        for line in block.body.splitlines():
            command, _, comment = line.partition("#")
            expected = _EXIT.search("#" + comment)
            assert expected, f"{block}: a command without `# exit N`: {line}"
            commands.append((command.strip(), int(expected[1])))
    return commands


COMMANDS = _review_commands()


def test_the_readme_shows_every_exit_code():
    assert {code for _, code in COMMANDS} == {0, 1, 2}
    assert all("gpufrac review" in c for c, _ in COMMANDS)
    assert any(" - " in f"{c} " for c, _ in COMMANDS) and any("--old" in c for c, _ in COMMANDS)


@pytest.mark.parametrize(("command", "expected"), COMMANDS, ids=[c[:60] for c, _ in COMMANDS])
def test_readme_review_command_runs_as_written(command, expected):
    runnable = command.replace(".venv/bin/gpufrac", f"{shlex.quote(sys.executable)} -m gpufrac")
    result = subprocess.run(["bash", "-c", runnable], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == expected, result.stdout[-2000:] + result.stderr
    assert "Traceback" not in result.stderr
    for path in re.findall(r"examples/[\w./*-]+", command):
        assert list(ROOT.glob(path)), f"{path} does not exist"
