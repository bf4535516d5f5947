"""e2e/denial_corpus.py holds every denial case of tests/e2e/test_denials.py and test_escapes.py, so the
admission-policy run (tests/e2e/test_admission_policies.py) sends the whole corpus: a new denial test there fails
here until its case is added (with the reason when the policies do not carry it)."""

from __future__ import annotations

import re
from pathlib import Path

from e2e.denial_corpus import CORPUS, NOT_DENIALS

E2E = Path(__file__).resolve().parents[1] / "e2e"  # tests/e2e


def test_every_test_of_the_two_files_is_in_the_corpus() -> None:
    sources = {c.source for c in CORPUS} | NOT_DENIALS
    for name in ("test_denials.py", "test_escapes.py"):
        tests = set(re.findall(r"^def (test_\w+)", (E2E / name).read_text(), re.M))
        assert tests, name
        assert tests <= sources, f"{name}: cases not in e2e/denial_corpus.py: {sorted(tests - sources)}"


def test_case_ids_are_unique_and_uncovered_cases_say_why() -> None:
    ids = [c.id for c in CORPUS]
    assert len(ids) == len(set(ids))
    assert all(c.fragments for c in CORPUS)
