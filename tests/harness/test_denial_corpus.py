"""e2e/denial_corpus.py is the one place a denial case is written: tests/e2e/test_denials.py sends every case for
real, tests/e2e/test_admission_policies.py sends every case to each engine, tests/webhook/test_denial_corpus.py runs
every CREATE in process. A test module of tests/e2e that writes a refusal of a pod by hand fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from e2e.denial_corpus import CORPUS, NOT_DENIALS, SETUPS

E2E = Path(__file__).resolve().parents[1] / "e2e"  # tests/e2e
# The corpus had 127 cases when it became the one source, and 7 more came from test_bind_and_updates.py and
# test_kai_e2e.py: a case may move or be rewritten, never silently go.
CASES_AT_LEAST = 134


def test_no_case_is_lost_and_every_case_is_whole() -> None:
    ids = [c.id for c in CORPUS]
    assert len(ids) == len(set(ids)), "two cases share an id"
    assert len(ids) >= CASES_AT_LEAST, len(ids)
    assert all(c.fragments for c in CORPUS), [c.id for c in CORPUS if not c.fragments]
    assert {c.setup for c in CORPUS} - {""} <= set(SETUPS)
    assert all((c.manifest is None) == bool(c.setup) for c in CORPUS), "a CREATE carries its pod, an UPDATE a setup"


def _functions_calling(tree: ast.Module, name: str) -> set[str]:
    return {fn.name for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
            for node in ast.walk(fn) if isinstance(node, ast.Name) and node.id == name}


def test_the_e2e_tests_refuse_pods_only_through_the_corpus() -> None:
    """assert_denied (a pod refused by a gpufrac webhook or policy) is called by the corpus test alone; the tests
    beside it in test_denials.py and test_escapes.py are what must still work (NOT_DENIALS)."""
    callers = {}
    for path in sorted(E2E.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        callers[path.name] = _functions_calling(tree, "assert_denied")
    assert {k: v for k, v in callers.items() if v} == {
        "test_denials.py": {"test_refused_with_its_message_and_nothing_stored", "test_wrong_examples_are_denied"}}
    source = (E2E / "test_denials.py").read_text()
    assert re.search(r'parametrize\("case", CORPUS\b', source), "test_denials.py sends every case of the corpus"
    beside = set(re.findall(r"^def (test_\w+)", (E2E / "test_escapes.py").read_text(), re.M))
    assert beside and beside <= NOT_DENIALS, beside - NOT_DENIALS
