"""docs/compatibility.md stays honest: every cell that says "tested here" names a test, and every test it names exists
(a file under tests/ with that test function), so a row cannot claim a test that was renamed or removed."""

from __future__ import annotations

import re

from testkit import REPO_ROOT

MATRIX = REPO_ROOT / "docs" / "compatibility.md"
CITATION = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def node_stack_rows() -> list[list[str]]:
    text = MATRIX.read_text().split("## The node stack", 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in text.splitlines()
            if line.startswith("| ")]
    return rows[1:]  # below the header


def test_every_cited_test_exists() -> None:
    citations = CITATION.findall(MATRIX.read_text())
    assert len(citations) >= 15
    for path, name in citations:
        source = REPO_ROOT / path
        assert source.is_file(), f"docs/compatibility.md cites {path}, which does not exist"
        assert re.search(rf"^def {name}\(", source.read_text(), re.MULTILINE), f"{path} has no {name}"


def test_each_row_is_tested_here_with_a_test_or_untested() -> None:
    rows = node_stack_rows()
    components = {row[0] for row in rows}
    assert {"containerd", "NVIDIA container toolkit", "NVIDIA GPU Operator", "NVIDIA driver",
            "KAI Scheduler"} <= components
    for component, version, here, _ in rows:
        assert here.startswith(("tested here", "untested")), f"{component} {version}: {here[:40]}"
        if here.startswith("tested here") and component != "cgroup":
            assert CITATION.search(here), f"{component} {version} says tested without naming a test"
    versions = {(row[0], row[1].split(",")[0]) for row in rows}
    assert {("containerd", "2.1 and later"), ("containerd", "2.0"), ("containerd", "1.7 (and 1.6)"),
            ("NVIDIA container toolkit", "1.17"), ("NVIDIA GPU Operator", "before 25.10"),
            ("NVIDIA GPU Operator", "25.10 and later"), ("NVIDIA driver", "580 / 595")} <= versions
