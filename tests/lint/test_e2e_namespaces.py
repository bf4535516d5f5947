"""No test in tests/e2e uses a namespace another test uses.

Two guards, both shown here without a cluster: the e2e tests' conftest gives every test a namespace made for it
(`ns`, as kr8s's suite does) and binds alice, binder and admin to it, recording each namespace a kubectl call of
theirs writes in; a test that wrote in a namespace another test wrote in fails at its teardown
(testkit/namespace_ledger.py, exercised below on the command lines the tests send). And no test module names the
users' shared namespace of the demo cluster (team-a), so none can write there behind the fixtures' back.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from testkit.namespace_ledger import NamespaceLedger, written_namespaces

E2E = Path(__file__).resolve().parents[1] / "e2e"


@pytest.mark.parametrize(("args", "stdin", "written"), [
    (("create", "-f", "-", "-o", "json"), '{"kind": "Pod", "metadata": {"name": "p"}}', {"mine"}),
    (("create", "-f", "-"), '{"kind": "Pod", "metadata": {"name": "p", "namespace": "other"}}', {"other"}),
    (("apply", "-f", "-"), '{"kind": "List", "items": [{"metadata": {"namespace": "a"}}, {"metadata": {}}]}', {"a"}),
    (("annotate", "--overwrite", "pod", "p", "k=v"), None, {"mine"}),
    (("create", "-f", "-", "--dry-run=server", "-n", "gpufrac-system"), "{}", set()),
    (("annotate", "--dry-run=server", "pod", "p", "k=v"), None, set()),
    (("get", "pods", "-n", "kube-system"), None, set()),
    (("-n", "mine", "delete", "pod", "p", "-n", "kai-scheduler"), None, {"kai-scheduler"}),
    (("patch", "pdb", "--namespace=elsewhere", "x", "-p", "{}"), None, {"elsewhere"}),
    (("create", "--raw", "/api/v1/namespaces/theirs/pods/p/binding", "-f", "-"), "{}", {"theirs"}),
    (("create", "--raw", "/api/v1/namespaces/theirs/pods/p/binding?dryRun=All", "-f", "-"), "{}", set()),
    (("debug", "pod/p", "--image=busybox:1.37", "--target=app"), None, {"mine"}),
])
def test_the_namespaces_a_kubectl_call_writes_in(args, stdin, written):
    assert written_namespaces(args, "mine", stdin) == written


def test_a_test_writing_in_another_tests_namespace_is_caught():
    ledger = NamespaceLedger()
    ledger.record("test_a", {"e2e-1-a"})  # its own namespace, made for it
    ledger.record("test_a", written_namespaces(("create", "-f", "-"), "e2e-1-a", "{}"))
    ledger.record("test_b", {"e2e-1-b"})
    ledger.record("test_b", written_namespaces(("label", "pod", "p", "x=y", "-n", "e2e-1-a"), "e2e-1-b"))
    assert ledger.reused("test_a") == {}
    assert ledger.reused("test_b") == {"e2e-1-a": "test_a"}
    ledger.record("test_c", written_namespaces(("get", "pod", "-n", "e2e-1-a"), "e2e-1-c"))  # reading is fine
    assert ledger.reused("test_c") == {}


def _fixture_params(tree: ast.Module) -> dict[str, list[str]]:
    return {fn.name: [a.arg for a in fn.args.args] for fn in tree.body if isinstance(fn, ast.FunctionDef)}


def test_alice_binder_and_admin_act_in_the_tests_own_namespace():
    params = _fixture_params(ast.parse((E2E / "conftest.py").read_text()))
    for user in ("alice", "binder", "admin"):
        assert "ns" in params[user], f"the {user} fixture is not bound to the test's namespace"
    source = (E2E / "conftest.py").read_text()
    assert "uuid.uuid4()" in source and '"delete", "namespace", name, "--wait=false"' in source


def _names_the_shared_namespace(path: Path) -> list[int]:
    tree = ast.parse(path.read_text())
    return [node.lineno for node in ast.walk(tree)
            if (isinstance(node, ast.Name) and node.id == "USER_NAMESPACE")
            or (isinstance(node, ast.alias) and node.name == "USER_NAMESPACE")
            or (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and (node.value == "team-a" or "team-a/" in node.value))]


def test_no_e2e_test_names_the_shared_users_namespace():
    found = {p.name: lines for p in sorted(E2E.glob("*.py")) if (lines := _names_the_shared_namespace(p))}
    assert not found, f"names team-a (USER_NAMESPACE) instead of the test's own namespace: {found}"
