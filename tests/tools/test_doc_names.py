"""The docs name only what exists: every chart values key they write in backticks (`dra.defaultFrontDoor`,
`enforcement.overLimitAction=evict`) is a key of values.yaml or values.schema.json, and every Event or condition
reason they name (a backticked CamelCase word on a line about a reason, an Event or a condition) is one the code,
the chart or its tests write. Renaming a key or a reason without the docs fails here."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpufrac"
DOCS = (ROOT / "README.md", CHART / "README.md", CHART / "templates" / "NOTES.txt",
        *sorted((ROOT / "docs").glob("*.md")))
CODE_DIRS = ("gpufrac", "charts/gpufrac/templates", "testkit", "e2e")
CODE_SUFFIXES = (".py", ".yaml", ".tpl", ".txt", ".c", ".sh", ".json")
# Names of other projects' objects the docs mention beside conditions (KAI's node objects, not reasons).
# Names of others a doc may quote: KAI's configs, Kubernetes' pod condition and Job pod-failure-policy action.
EXTERNAL = {"GpuSharingConfig", "GpuFractioningConfig", "DisruptionTarget", "FailJob"}

VALUES_KEY = re.compile(r"`([a-z][a-zA-Z0-9]*(?:\.[a-zA-Z][a-zA-Z0-9]*)+)(?:=[^`]*)?`")
CAMEL = re.compile(r"`([A-Z][a-z0-9]+(?:[A-Z][a-zA-Z0-9]*)+)`")
NOT_KEYS = {"io", "com", "org", "proto", "yaml", "json", "md", "py", "sh", "toml"}
ABOUT_REASONS = re.compile(r"reason|Event|condition")


def _keys(node: Any) -> set[str]:
    if not isinstance(node, dict):
        return set()
    return {k for k in node} | {k for v in node.values() for k in _keys(v)}


class Chart:
    def __init__(self) -> None:
        self.values = yaml.safe_load((CHART / "values.yaml").read_text())
        self.schema = json.loads((CHART / "values.schema.json").read_text())
        self.every_key = _keys(self.values)
        self.modules = {p.stem for p in (ROOT / "gpufrac").rglob("*.py")} | {
            p.name for p in (ROOT / "gpufrac").rglob("*") if p.is_dir()}

    def has(self, path: list[str]) -> bool:
        """The key is in values.yaml or the schema; below a leaf (a free-form map, a list) anything goes."""
        value: Any = self.values
        schema: Any = self.schema
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
            schema = (schema.get("properties") or {}).get(part) if isinstance(schema, dict) else None
            if value is None and schema is None:
                return False
            if not isinstance(value, dict) and not (isinstance(schema, dict) and "properties" in schema):
                return True
        return True

    def names_a_key(self, path: list[str]) -> bool:
        """Written like a values key: rooted at a top-level key (not a module path of the package), or ending in a
        camelCase key of the chart (`guarantee.overLimitAction`)."""
        if path[-1] in NOT_KEYS:  # a domain (mps.gpufrac.io) or a file name (csi.proto)
            return False
        module = any(part in self.modules for part in path[1:])
        if path[0] in self.values and not module:
            return True
        return bool(re.search("[A-Z]", path[-1])) and path[-1] in self.every_key


def code_words() -> frozenset[str]:
    """Every word of the code, the chart's templates, the test kit and the harness (a reason is one of them)."""
    return frozenset(word for d in CODE_DIRS for p in (ROOT / d).rglob("*")
                     if p.is_file() and p.suffix in CODE_SUFFIXES
                     for word in re.findall(r"[A-Za-z][A-Za-z0-9]*", p.read_text(errors="ignore")))


def unknown_names(text: str, chart: Chart, code: frozenset[str]) -> Iterator[str]:
    """What a doc's text names that does not exist, as `line N: what`."""
    for number, line in enumerate(text.splitlines(), 1):
        for match in VALUES_KEY.finditer(line):
            path = match[1].split(".")
            if chart.names_a_key(path) and not chart.has(path):
                yield f"line {number}: values key {match[1]}"
        if ABOUT_REASONS.search(line):
            for match in CAMEL.finditer(line):
                if match[1] not in EXTERNAL and match[1] not in code:
                    yield f"line {number}: reason {match[1]}"


@pytest.fixture(scope="module")
def chart() -> Chart:
    return Chart()


@pytest.fixture(scope="module")
def code() -> frozenset[str]:
    return code_words()


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_the_docs_name_only_values_keys_and_reasons_that_exist(doc: Path, chart: Chart, code: frozenset[str]) -> None:
    assert list(unknown_names(doc.read_text(), chart, code)) == []


def test_a_wrong_key_or_reason_seeded_into_a_doc_is_found(chart: Chart, code: frozenset[str]) -> None:
    """What the test above would say of the mistakes the docs once made."""
    seeded = ("The action `guarantee.overLimitAction` says.\n"
              "Set `dra.defaultFrontDoor=annotations` and `agent.interval`.\n"
              "The node condition's reason `DriverWithoutMemoryLimit` (a typo) or `GPUServedThroughDra`.\n"
              "Module `agent.decide.capabilities` and a field `consumedCapacity.memory` name no key.")
    assert list(unknown_names(seeded, chart, code)) == [
        "line 1: values key guarantee.overLimitAction",
        "line 2: values key agent.interval",
        "line 3: reason DriverWithoutMemoryLimit",
    ]
