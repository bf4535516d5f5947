"""End-to-end fixtures: one real control plane (etcd + kube-apiserver + the gpufrac webhook registered through
the chart) for the whole session, and kubectl as alice / the scheduler's binder / admin.

Without the tools (``make tools``) every e2e test is skipped with a loud reason, unless ``CI`` is set: then a
missing tool is an error, so CI never goes green without having run them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # `pytest` (not `python -m pytest`) does not put the repo root on sys.path
    sys.path.insert(0, str(REPO_ROOT))

from e2e.cluster import ControlPlane  # noqa: E402 (after the sys.path fix above)
from e2e.state import private_workdir  # noqa: E402 (after the sys.path fix above)
from e2e.testing import Kubectl  # noqa: E402
from e2e.toolkit.errors import ClusterError, ToolsMissingError  # noqa: E402 (after the sys.path fix above)
from e2e.toolkit.tools import Tools  # noqa: E402 (after the sys.path fix above)

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


# ---- kubectl as a user -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def alice(cluster: ControlPlane) -> Kubectl:
    """kubectl as alice (namespace team-a): ``rc, out, err = alice("get", "pods")``."""
    return lambda *args, **kw: cluster.kubectl(*args, user="alice", **kw)


@pytest.fixture(scope="session")
def binder(cluster: ControlPlane) -> Kubectl:
    """kubectl as system:serviceaccount:kai-scheduler:binder."""
    return lambda *args, **kw: cluster.kubectl(*args, user="binder", **kw)


@pytest.fixture(scope="session")
def admin(cluster: ControlPlane) -> Kubectl:
    """kubectl as a cluster admin (system:masters)."""
    return lambda *args, **kw: cluster.kubectl(*args, user="admin", **kw)
