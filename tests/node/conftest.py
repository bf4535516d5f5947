"""Real-node fixtures: one real one-node cluster (e2e.node.RealCluster: containerd, kubelet, controller-manager,
scheduler, kube-proxy) for the session, with gpufrac installed by `helm install` and the local values file.

Without the node's tools (NVIDIA's components included: e2e/build-nvidia.sh) or images (``make tools image``)
these tests are skipped with a loud reason, unless ``CI`` is set: then that is an error. Another real node on the
machine (the lock) is waited for up to 15 min.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from e2e.install import RELEASE, Helm  # noqa: E402
from e2e.names import RELEASE_NAMESPACE  # noqa: E402
from e2e.node import DEVICE_PLUGIN, RealCluster, images_missing  # noqa: E402
from e2e.state import private_workdir  # noqa: E402
from e2e.testing import unique  # noqa: E402
from e2e.toolkit.errors import ClusterError, ToolsMissingError  # noqa: E402
from e2e.toolkit.nvidia_toolkit import TOOLKIT_BINARIES, nvidia_binaries  # noqa: E402
from e2e.toolkit.tools import node_binaries  # noqa: E402

_notes: list[str] = []


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _unavailable(reason: str) -> None:
    if _in_ci():
        pytest.fail(f"CI is set and the real node cannot start: {reason}", pytrace=False)
    _notes.append(f"REAL-NODE TESTS SKIPPED: {reason}")
    pytest.skip(reason)


def _require_real_node() -> None:
    """Skip (fail under CI) where a real node cannot start: not root, no node tools, no images."""
    if os.geteuid() != 0:
        _unavailable("the real node needs root (network namespace, mounts, cgroups)")
    try:
        node_binaries()
        nvidia_binaries((*TOOLKIT_BINARIES, DEVICE_PLUGIN))
    except ToolsMissingError as exc:
        _unavailable(str(exc))
    if missing := images_missing():
        _unavailable(f"missing images {', '.join(missing)}: run `make image`")
    os.environ.setdefault("GPUFRAC_NODE_LOCK_WAIT", "900")


@pytest.fixture(scope="session")
def node(request: pytest.FixtureRequest) -> Iterator[RealCluster]:
    _require_real_node()
    cluster = RealCluster(private_workdir("node"))
    try:
        cluster.start()
    except ClusterError as exc:
        pytest.fail(f"the real node did not start: {exc}", pytrace=False)
    _notes.append(f"[e2e] real node up in {cluster.timings.get('cold_start_s')} s (node Ready after "
                  f"{cluster.timings.get('node_ready_s')} s; NVIDIA's CDI spec and toolkit config made in "
                  f"{cluster.timings.get('nvidia_toolkit_s')} s; its device plugin registered "
                  f"{cluster.timings.get('device_plugin_ready_s')} s after start)")
    yield cluster
    failed = request.session.testsfailed > 0
    if failed:
        _notes.append(f"[e2e] logs of the real node kept in {cluster.workdir}")
    cluster.stop(remove_workdir=not failed)


@pytest.fixture(scope="session")
def require_real_node() -> Callable[[], None]:
    """For a test that starts real nodes of its own: call it to skip (fail under CI) where none can start."""
    return _require_real_node


@pytest.fixture(scope="session")
def helm(node: RealCluster) -> Helm:
    return Helm(node)


@pytest.fixture(scope="module")
def installed(node: RealCluster, helm: Helm) -> Helm:
    """gpufrac installed as a user installs it (the first test of a module that needs it installs it: a module
    before may have uninstalled it, as test_real_node.py's last test does)."""
    if not helm.installed():
        helm.install()
    return helm


def user_values(helm: Helm) -> dict:
    return json.loads(helm.run("get", "values", RELEASE, "-n", RELEASE_NAMESPACE, "-o", "json").stdout or "{}")


@pytest.fixture
def evicting(node: RealCluster, installed: Helm) -> Iterator[Helm]:
    """The release with `reclaim.policy=evict` and a short grace period (so the webhook gives a controller's pods the
    back-off affinity, reclaim.backoffSeconds being 600); rolled back to the revision it was at."""
    found = json.loads(installed.run("status", RELEASE, "-n", RELEASE_NAMESPACE, "-o", "json").stdout)
    values = user_values(installed)
    installed.upgrade("reclaim.policy=evict", "reclaim.gracePeriodSeconds=2")
    try:
        yield installed
    finally:
        installed.run("rollback", RELEASE, str(found["version"]), "-n", RELEASE_NAMESPACE, "--wait",
                      "--timeout", "5m")
        assert user_values(installed) == values
        # a rollback runs no hooks: the older revision's caBundle (none, for the first) is written again as
        # docs/operations.md says, by a one-off run of the certificate CronJob
        job = unique("gpufrac-certs-after-rollback")
        for args in (("create", "job", job, "--from=cronjob/gpufrac-certs"),
                     ("wait", "--for=condition=complete", f"job/{job}", "--timeout=300s"),
                     ("delete", "job", job, "--wait=false")):
            res = node.kubectl("-n", RELEASE_NAMESPACE, *args, user="admin")
            assert res.rc == 0, res.stderr


@pytest.fixture
def gpu_processes(node: RealCluster) -> Iterator:
    """The fake NVML's state, written back as it was found."""
    found = json.loads((node.gpu_fakes / "nvml.json").read_text())
    gpus = node.gpu_state()
    try:
        yield gpus
    finally:
        gpus.state = found
        gpus.write()


def pytest_terminal_summary(terminalreporter) -> None:
    for line in _notes:
        terminalreporter.write_line(line)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """tests/node/test_readme_cluster.py first among the real-node tests: its commands start and stop real nodes of
    their own, so it must run before the session's node takes the machine's one lock."""
    here = Path(__file__).parent
    first = [i for i in items if i.path.name == "test_readme_cluster.py" and i.path.parent == here]
    if not first:
        return
    rest = [i for i in items if i not in first]
    at = next((k for k, i in enumerate(rest) if i.path.parent == here), len(rest))
    items[:] = [*rest[:at], *first, *rest[at:]]
