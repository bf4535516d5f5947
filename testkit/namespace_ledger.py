"""Which namespace each e2e test writes in, read off its kubectl command lines, so that a test writing in a
namespace another test wrote in is caught (tests/e2e/conftest.py keeps one ledger for the session).

A test may read any namespace (the chart's gpufrac-system, kube-system, KAI's): only writes are counted, and a
server-side or client-side dry run stores nothing, so it is no write either.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# kubectl verbs that store or remove something.
WRITE_VERBS = frozenset({"create", "apply", "patch", "annotate", "label", "delete", "replace", "debug", "edit",
                         "set", "scale", "taint", "drain", "cordon", "uncordon", "expose", "run", "rollout",
                         "autoscale"})
_FLAGS_WITH_VALUES = frozenset({"-n", "--namespace", "-f", "--filename", "-p", "--patch", "-o", "--output", "--raw",
                                "--type", "--subresource", "-c", "--container", "-l", "--selector", "--image",
                                "--field-selector", "--grace-period", "--timeout", "--field-manager"})
_RAW_NAMESPACE = re.compile(r"/namespaces/([a-z0-9][a-z0-9-]*)/")


def _verb(args: Sequence[str]) -> str:
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _FLAGS_WITH_VALUES:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return ""


def _flag_values(args: Sequence[str], *names: str) -> list[str]:
    values = []
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                values.append(args[i + 1])
            elif arg.startswith(name + "="):
                values.append(arg.partition("=")[2])
    return values


def _input_namespaces(text: str | None) -> set[str]:
    if not text:
        return set()
    try:
        doc: Any = json.loads(text)
    except ValueError:
        return set()  # YAML or plain text: the command line's namespace is the one that counts
    items = doc.get("items", [doc]) if isinstance(doc, dict) else []
    return {ns for item in items if isinstance(item, dict)
            for ns in [item.get("metadata", {}).get("namespace")] if isinstance(ns, str)}


def written_namespaces(args: Sequence[str], default: str, input: str | None = None) -> set[str]:
    """The namespaces `kubectl <args>` (with `input` on stdin) writes in; `default` is the one it runs in when the
    command line names none. Empty for a read or a dry run."""
    if _verb(args) not in WRITE_VERBS or any(a.startswith("--dry-run") and a != "--dry-run=none" for a in args):
        return set()
    raw = _flag_values(args, "--raw")
    if raw:
        return set() if "dryRun=All" in raw[-1] else set(_RAW_NAMESPACE.findall(raw[-1]))
    named = _flag_values(args, "-n", "--namespace")
    return (_input_namespaces(input) or {named[-1] if named else default})


@dataclass
class NamespaceLedger:
    """Test id -> the namespaces it wrote in; `reused` names those another test wrote in first."""

    writers: dict[str, str] = field(default_factory=dict)  # namespace -> the first test that wrote in it
    by_test: dict[str, set[str]] = field(default_factory=dict)

    def record(self, test: str, namespaces: set[str]) -> None:
        self.by_test.setdefault(test, set()).update(namespaces)
        for ns in namespaces:
            self.writers.setdefault(ns, test)

    def reused(self, test: str) -> dict[str, str]:
        """The namespaces `test` wrote in that another test wrote in before it: namespace -> that test."""
        return {ns: self.writers[ns] for ns in sorted(self.by_test.get(test, ())) if self.writers[ns] != test}
