"""The command blocks of the README and of docs/, and which test runs each: the one extractor for all of them.

Every ```bash block's info string names its runner (the first word), optionally with a step or scenario after
`=`, then tags:

- `test[=webhook-down|=webhook-up] [fails]`: tests/e2e/test_docs.py runs the block in its shell against a control
  plane of its own; `fails`: it must fail; a `# → text` line is output it must print;
- `lines`: each line is one command with `# exit N`, run from the repository root (tests/webhook/test_readme.py);
- `here=<step>`: tests/e2e/test_readme.py runs the step on this machine (`make run`, the image, the GPU check);
- `node`: tests/node/test_readme_cluster.py runs it on the real local cluster.

A block with any other info string (or none) is one no test runs, and tests/harness/test_docblocks.py fails on it.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RUNNERS = ("test", "lines", "here", "node")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>bash|sh|shell|console)(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)```",
                   re.M | re.S)


@dataclass
class Block:
    doc: str
    line: int
    body: str
    runner: str  # one of RUNNERS, or "" when the block names none
    step: str  # after `=`: the scenario of a `test` block, the step of a `here` block
    tags: tuple[str, ...]

    @property
    def fails(self) -> bool:
        return "fails" in self.tags

    @property
    def scenario(self) -> str:
        return self.step if self.runner == "test" else ""

    @property
    def expected(self) -> list[str]:
        return [m.group(1).strip() for m in re.finditer(r"^\s*# → (.*)$", self.body, re.M)]

    def commands(self) -> list[str]:
        """The block's commands, one per line, without their comments (for blocks of one-line commands)."""
        return [line.split("#", 1)[0].strip() for line in self.body.splitlines()
                if line.split("#", 1)[0].strip()]

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"


def markdown_files() -> list[str]:
    """Every tracked Markdown file, relative to the repository root."""
    out = subprocess.run(["git", "ls-files", "*.md"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    return out.stdout.split()


def every_block(runner: str) -> list[Block]:
    """The blocks of `runner` in every tracked Markdown file (the README and docs/ share the runners)."""
    return [b for doc in markdown_files() for b in blocks(doc, runner)]


def blocks(doc: str, runner: str | None = None) -> list[Block]:
    """Every shell block of `doc` (a path relative to the repository root), or only those of `runner`."""
    text = (REPO_ROOT / doc).read_text()
    found = []
    for m in FENCE.finditer(text):
        words = m.group("info").split()
        first = words[0] if words else ""
        name, _, step = first.partition("=")
        indent = len(m.group("indent"))
        body = "\n".join(line[indent:] for line in m.group("body").splitlines())
        block = Block(doc, text.count("\n", 0, m.start()) + 1, body, name if name in RUNNERS else "", step,
                      tuple(words[1:]))
        if runner is None or block.runner == runner:
            found.append(block)
    return found
