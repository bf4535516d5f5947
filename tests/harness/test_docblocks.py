"""Every shell block of every Markdown file names the test that runs it (testkit/docblocks.py), and the extractor
reads what the blocks say."""

from __future__ import annotations

from pathlib import Path

from testkit.docblocks import RUNNERS, blocks, every_block, markdown_files


def test_every_shell_block_names_the_test_that_runs_it():
    files = markdown_files()
    assert "README.md" in files and "docs/install.md" in files
    unmarked = [str(b) for doc in files for b in blocks(doc) if not b.runner]
    assert not unmarked, f"command blocks no test runs (mark them, see testkit/docblocks.py): {unmarked}"
    used = {runner for runner in RUNNERS if every_block(runner)}
    assert used == set(RUNNERS), used  # every runner runs something; each runner's test checks it ran them all
    assert {b.runner for b in blocks("README.md")} == {"test", "lines", "here"}  # `node`: docs/development.md


def test_the_extractor_reads_runner_step_tags_and_expected_output(tmp_path: Path):
    doc = tmp_path / "doc.md"
    doc.write_text("text\n\n```bash test=webhook-down fails\nkubectl get pods\n# → No resources\n```\n\n"
                   "  ```bash here=image\n  make image   # builds\n\n  buildah push x\n  ```\n\n"
                   "```bash\nunmarked\n```\n\n```sh maybe\nunknown runner\n```\n\n```yaml\nnot: a command\n```\n")
    found = blocks(str(doc))
    assert [(b.runner, b.step, b.line) for b in found] == [("test", "webhook-down", 3), ("here", "image", 8),
                                                          ("", "", 14), ("", "", 18)]
    down, image = found[:2]
    assert down.fails and down.scenario == "webhook-down" and down.expected == ["No resources"]
    assert not image.fails and image.scenario == "" and image.commands() == ["make image", "buildah push x"]
    assert [b.line for b in blocks(str(doc), "here")] == [8]
