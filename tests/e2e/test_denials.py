"""Every denial case of e2e/denial_corpus.py, sent for real as the user sends it (kubectl create, annotate, patch,
apply, debug, a Binding), each in a namespace of the test's own: refused by a gpufrac webhook or policy, with a
message that names what it is about (docs/architecture.md, "One review"), and nothing stored: the prepared pod is
exactly as it was (same resourceVersion, annotations, labels and spec), or a refused CREATE left no pod."""

from __future__ import annotations

import json

import pytest

from e2e.denial_corpus import CORPUS, DEVICES, NEW_POD, Case, Target, Users, prepare
from e2e.names import NODE_NAME
from e2e.testing import Kubectl, assert_denied

pytestmark = pytest.mark.e2e


def _stored(admin: Kubectl, name: str) -> dict:
    rc, out, err = admin("get", "pod", name, "-o", "json")
    assert rc == 0, err
    return json.loads(out)


def _prepared(setup: str, users: Users, ns: str) -> dict:
    """The pod an UPDATE case edits, as stored."""
    name = f"corpus-{setup}"
    prepare(setup, users, ns, name)
    stored = _stored(users.admin, name)
    if setup == "bound":  # bound the way KAI's binder binds the seed notebook, its limit canonical
        assert stored["spec"].get("nodeName") == NODE_NAME
        assert stored["metadata"]["annotations"]["gpufrac.io/container.app.gpu-memory.limit-mib"] == "115016"
        assert DEVICES in stored["metadata"]["annotations"]
    return stored


def _unchanged(admin: Kubectl, before: dict) -> None:
    after = _stored(admin, before["metadata"]["name"])
    for part in ("annotations", "labels"):
        assert after["metadata"].get(part) == before["metadata"].get(part), f"metadata.{part} changed"
    assert after["spec"] == before["spec"], "spec changed"
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], "pod was written"


@pytest.mark.parametrize("case", CORPUS, ids=[c.id for c in CORPUS])
def test_refused_with_its_message_and_nothing_stored(case: Case, ns: str, alice: Kubectl, binder: Kubectl,
                                                     admin: Kubectl) -> None:
    users = Users(alice, binder, admin)
    before = _prepared(case.setup, users, ns) if case.setup else None
    name = before["metadata"]["name"] if before else NEW_POD
    res = case.send(Target(users, ns, name, dry=False))
    message = assert_denied(res, *case.fragments)
    assert case.denied_by in message, f"not refused by {case.denied_by}: {message}"
    assert not [u for u in case.unsaid if u in message], message
    if before is not None:
        _unchanged(admin, before)
    else:
        rc, out, err = admin("get", "pod", NEW_POD, "-o", "name")
        assert rc != 0 and "NotFound" in err, f"a refused CREATE stored pod {out}"


def test_wrong_examples_are_denied(alice: Kubectl) -> None:
    """Every examples/wrong-*.yaml is refused (they are what `make demo` shows)."""
    from testkit.pods import EXAMPLES

    wrong = sorted(EXAMPLES.glob("wrong-*.yaml"))
    assert len(wrong) >= 5
    for path in wrong:
        res = alice("create", "--dry-run=server", "-f", str(path))
        assert_denied(res)
