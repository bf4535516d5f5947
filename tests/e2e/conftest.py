"""End-to-end fixtures: one real control plane (etcd + kube-apiserver + the gpufrac webhook registered through
the chart) for the whole session, a namespace of its own for every test (as kr8s's suite gives each test one), and
kubectl as alice / the scheduler's binder / admin in it.

No test shares a namespace: `ns` is made fresh for the test that asks for it (alice, binder and admin ask for it),
and every write of theirs is recorded (testkit/namespace_ledger.py); a test that wrote in a namespace another test
wrote in fails at its teardown.

Without the tools (``make tools``) every e2e test is skipped with a loud reason, unless ``CI`` is set: then a
missing tool is an error, so CI never goes green without having run them.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # `pytest` (not `python -m pytest`) does not put the repo root on sys.path
    sys.path.insert(0, str(REPO_ROOT))

from e2e.cluster import ControlPlane  # noqa: E402 (after the sys.path fix above)
from e2e.kubectl import KubectlResult  # noqa: E402
from e2e.state import private_workdir  # noqa: E402 (after the sys.path fix above)
from e2e.testing import Kubectl  # noqa: E402
from e2e.toolkit import objects  # noqa: E402 (after the sys.path fix above)
from e2e.toolkit.errors import ClusterError, ToolsMissingError  # noqa: E402 (after the sys.path fix above)
from e2e.toolkit.tools import Tools  # noqa: E402 (after the sys.path fix above)
from testkit.namespace_ledger import NamespaceLedger, written_namespaces  # noqa: E402

_skip_reason: list[str] = []
_started: list[str] = []


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    try:
        tools = Tools.find()
    except ToolsMissingError as exc:
        if _in_ci():
            pytest.fail(f"CI is set and the e2e control plane cannot start: {exc}", pytrace=False)
        reason = f"E2E TESTS SKIPPED (no control plane): {exc}"
        _skip_reason.append(reason)
        pytest.skip(reason)
    # .e2e/pytest-<pid>: a session of its own, so parallel runs in one checkout (or `make cluster-up`) are safe.
    cp = ControlPlane(private_workdir("pytest"), tools=tools)
    try:
        cp.start()
    except ClusterError as exc:
        pytest.fail(f"the e2e control plane did not start: {exc}", pytrace=False)
    _started.append(
        f"\n[e2e] control plane up in {cp.timings.get('cold_start_s')} s "
        f"({cp.server_version}, kube-apiserver ready after {cp.timings.get('apiserver_ready_s')} s)\n"
    )
    yield cp
    _deleting.shutdown(wait=True)  # the namespaces' deletions were sent before the API server goes
    # Logs stay for a failed session (.e2e/pytest-<pid>/*.log); the next session cleans them up.
    failed = request.session.testsfailed > 0
    if failed:
        _started.append(f"\n[e2e] logs of the control plane kept in {cp.workdir}\n")
    cp.stop(remove_workdir=not failed)


def _own_control_plane(kind: str, **kwargs: object) -> Iterator[ControlPlane]:
    """A control plane for one test module (one that stops the webhook or changes its configurations), in
    .e2e/<kind>-<pid>; skipped like the session's without the tools."""
    try:
        tools = Tools.find()
    except ToolsMissingError as exc:
        if _in_ci():
            pytest.fail(f"CI is set and the e2e control plane cannot start: {exc}", pytrace=False)
        pytest.skip(f"E2E TESTS SKIPPED (no control plane): {exc}")
    plane = ControlPlane(private_workdir(kind), tools=tools, **kwargs)  # type: ignore[arg-type]
    try:
        plane.start()
    except ClusterError as exc:
        pytest.fail(f"the control plane did not start: {exc}", pytrace=False)
    yield plane
    plane.stop(remove_workdir=True)


@pytest.fixture(scope="session")
def own_control_plane() -> Callable[..., Iterator[ControlPlane]]:
    """For a module's fixture: ``yield from own_control_plane("policies")`` starts and stops its own plane."""
    return _own_control_plane


def pytest_terminal_summary(terminalreporter) -> None:
    for line in _started:
        terminalreporter.write_line(line.strip())
    if _skip_reason:
        terminalreporter.write_sep("!", "END-TO-END TESTS DID NOT RUN", red=True, bold=True)
        terminalreporter.write_line(_skip_reason[0], red=True)


# ---- a namespace of its own for every test -------------------------------------------------------------------

_RUN = uuid.uuid4().hex[:4]  # this session's namespaces, told apart from another session's on the same cluster
_ledger = NamespaceLedger()
# A namespace is deleted in the background (--wait=false too): no test waits for the one before it to go.
_deleting = ThreadPoolExecutor(1, thread_name_prefix="delete-namespace")


def _namespace_name(test: str) -> str:
    """e2e-<run>-<the test's name, shortened>-<random>: a valid name (63 characters at most) that says whose it is."""
    name = test.rpartition("::")[2].lower()  # a node id's last part: the test[its case]; the case says more
    name = (name.partition("[")[2].rstrip("]") or name).removeprefix("test_")
    slug = re.sub(r"[^a-z0-9]+", "-", name).strip("-")[:36].rstrip("-")
    return f"e2e-{_RUN}-{slug}-{uuid.uuid4().hex[:6]}"


def _namespace_objects(name: str) -> list[dict]:
    """The namespace, its `default` ServiceAccount (no controller-manager makes it on the API-only cluster), and
    alice's rights in it: the cluster's own Role and RoleBinding for her (e2e/toolkit/bootstrap/alice.yaml)."""
    rights = [copy.deepcopy(obj) for obj in objects.load("alice.yaml")]
    for obj in rights:
        obj["metadata"]["namespace"] = name
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": name}},
            *rights]


@contextmanager
def own_namespace(plane: ControlPlane, test: str) -> Iterator[str]:
    """A namespace made for `test` on `plane`, deleted (without waiting) after it."""
    name = _namespace_name(test)
    plane.apply_objects(_namespace_objects(name))
    _ledger.record(test, {name})
    try:
        yield name
    finally:
        _deleting.submit(_delete_namespace, plane, name)


def _delete_namespace(plane: ControlPlane, name: str) -> None:
    """Its pods first, then the namespace, as the namespace controller does on a real cluster. The API-only one has
    no controller: without this, a pod an agent still watches would outlive its namespace, which then refuses the
    agent's Events for it ("being terminated")."""
    plane.kubectl("delete", "pods", "--all", "-n", name, "--force", "--grace-period=0", "--wait=false", user="admin")
    plane.kubectl("delete", "namespace", name, "--wait=false", user="admin")


@pytest.fixture(scope="session")
def fresh_namespace() -> Callable[[ControlPlane, str], contextlib.AbstractContextManager[str]]:
    """For a fixture on a control plane of its own: ``with fresh_namespace(plane, request.node.nodeid) as ns:``."""
    return own_namespace


@pytest.fixture
def ns(cluster: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    """This test's own namespace on the session's cluster (kr8s's `ns`): alice may do there what she may in
    team-a."""
    with own_namespace(cluster, request.node.nodeid) as name:
        yield name


def as_user(plane: ControlPlane, user: str, namespace: str, test: str) -> Kubectl:
    """kubectl as `user` in `namespace` (a `-n` of the test's own still wins), its writes recorded for `test`."""
    def kubectl(*args: str, **kw: object) -> KubectlResult:
        _ledger.record(test, written_namespaces(args, namespace, kw.get("input")))  # type: ignore[arg-type]
        return plane.kubectl("-n", namespace, *args, user=user, **kw)  # type: ignore[arg-type]
    return kubectl


@pytest.fixture(autouse=True)
def _no_namespace_of_another_test(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    reused = _ledger.reused(request.node.nodeid)
    if reused:
        pytest.fail("wrote in a namespace another test wrote in: "
                    + ", ".join(f"{ns} (first {first})" for ns, first in reused.items()), pytrace=False)


# ---- kubectl as a user, in the test's namespace ----------------------------------------------------------------


@pytest.fixture
def alice(cluster: ControlPlane, ns: str, request: pytest.FixtureRequest) -> Kubectl:
    """kubectl as alice in the test's namespace: ``rc, out, err = alice("get", "pods")``."""
    return as_user(cluster, "alice", ns, request.node.nodeid)


@pytest.fixture
def binder(cluster: ControlPlane, ns: str, request: pytest.FixtureRequest) -> Kubectl:
    """kubectl as system:serviceaccount:kai-scheduler:binder, in the test's namespace."""
    return as_user(cluster, "binder", ns, request.node.nodeid)


@pytest.fixture
def admin(cluster: ControlPlane, ns: str, request: pytest.FixtureRequest) -> Kubectl:
    """kubectl as a cluster admin (system:masters), in the test's namespace."""
    return as_user(cluster, "admin", ns, request.node.nodeid)
