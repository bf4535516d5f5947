"""The operator docs run: every ```bash test block of the README, docs/install.md, monitoring.md, gitops.md and
operations.md, then the chart's README, in that order, in one shell environment against a control plane of its
own (the chart installed in Service mode, as on a cluster).

A block's info string says what it needs (testkit/docblocks.py reads them): `bash test` must succeed; `fails` must
fail; `=webhook-down` runs while the webhook is away (its "pod" stopped, no ready endpoint) and `=webhook-up` once
it is back. A `# → text` line is output the block must print. The control plane has no controllers or kubelets:
e2e/standins.py runs the chart's Jobs and one webhook pod here, and marks workloads ready, as those would. The
README's other blocks run elsewhere (testkit/docblocks.py names where).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from e2e.cluster import ControlPlane
from e2e.crds import PROMETHEUS_OPERATOR, crd_files
from e2e.names import REPO_ROOT
from e2e.standins import StandInControllers, harness_address
from e2e.state import private_workdir
from e2e.toolkit.errors import ToolsMissingError
from e2e.toolkit.tools import Tools
from testkit.docblocks import Block, blocks, every_block

pytestmark = pytest.mark.e2e

# The README first: its install (an image from a registry) is uninstalled again before install.md's.
DOCS = ("README.md", "docs/install.md", "docs/monitoring.md", "docs/gitops.md", "docs/operations.md",
        "charts/gpufrac/README.md")
# The README's text names the uninstall that removes its install (section "helm install").
README_UNINSTALL = "helm uninstall gpufrac -n gpufrac-system"


def test_the_docs_mark_their_commands():
    assert {b.doc for b in every_block("test")} == set(DOCS)  # a page with `bash test` blocks is run here
    for doc in DOCS:
        found = blocks(doc)
        assert blocks(doc, "test"), doc
        unmarked = [str(b) for b in found if not b.runner]
        assert not unmarked, f"a command block no test runs: {unmarked}"
        if doc != "README.md":  # docs/ and the chart's README: every block runs here
            assert [b.runner for b in found] == ["test"] * len(found), doc
    # the outage's two refusals: the webhook unreachable, then (failure policy Ignore) the policy in its place
    down, last_resort = [b for b in blocks("docs/operations.md") if b.fails]
    assert down.scenario == last_resort.scenario == "webhook-down"
    assert down.expected == ['failed calling webhook "mutate.gpufrac.io"']
    assert "ValidatingAdmissionPolicy 'gpufrac-pods'" in last_resort.expected[0]
    assert f"`{README_UNINSTALL}`" in (REPO_ROOT / "README.md").read_text()


@pytest.fixture(scope="module")
def docs_env(tmp_path_factory):
    """A control plane of its own (the chart's release "gpufrac" would collide with the harness's webhook
    configurations), whose API server calls Service-mode webhooks through EndpointSlices."""
    try:
        tools = Tools.find()
    except ToolsMissingError as exc:
        pytest.skip(str(exc))
    with harness_address() as address:
        if address is None:
            pytest.skip("cannot add the harness's own link (root and iproute2 are needed) for the webhook's "
                        "EndpointSlice")
        yield from _docs_env(tools, address, tmp_path_factory)


def _docs_env(tools, address, tmp_path_factory):
    cp = ControlPlane(private_workdir("docs"), tools=tools, register_webhook=False,
                      apiserver_flags=("--enable-aggregator-routing=true",))
    cp.start()
    cp.stop_webhook()  # the harness's own; the docs install the chart's
    for path in crd_files(PROMETHEUS_OPERATOR):  # what a cluster with the Prometheus Operator serves
        result = cp.kubectl("apply", "--server-side", "-f", str(path), user="admin")
        assert result.rc == 0, result.stderr
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all", user="admin", check=True)
    shell = tmp_path_factory.mktemp("docs-shell")
    for name in ("charts", "examples"):
        (shell / name).symlink_to(REPO_ROOT / name)
    bin_dir = shell / ".bin"
    bin_dir.mkdir()
    for tool in (tools.helm, tools.kubectl):
        (bin_dir / Path(tool).name).symlink_to(tool)
    (bin_dir / "helm").exists() or (bin_dir / "helm").symlink_to(tools.helm)
    env = {**os.environ, "KUBECONFIG": str(cp.kubeconfigs["admin"]),
           "PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
           "HELM_CACHE_HOME": str(shell / ".helm/cache"), "HELM_CONFIG_HOME": str(shell / ".helm/config"),
           "HELM_DATA_HOME": str(shell / ".helm/data")}
    try:
        with StandInControllers(cp, shell, webhook_ip=address) as standins:
            yield cp, standins, shell, env
    finally:
        cp.stop()
        shutil.rmtree(cp.workdir, ignore_errors=True)


def run_block(block: Block, standins: StandInControllers, shell: Path, env: dict[str, str]) -> None:
    if block.scenario == "webhook-down":
        standins.webhook_down()
    elif block.scenario == "webhook-up":
        standins.webhook_up()
    result = subprocess.run(["bash", "-o", "pipefail", "-c", ("" if block.fails else "set -e\n") + block.body],
                            cwd=shell, env=env, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    where = f"{block} exited {result.returncode}:\n{block.body}\n--- output:\n{output[-3000:]}"
    if block.fails:
        assert result.returncode != 0, where
    else:
        assert result.returncode == 0, where
    for fragment in block.expected:
        assert fragment in output, f"{block}: expected {fragment!r}\n{where}"


@pytest.mark.parametrize("doc", DOCS)
def test_doc_commands_run(docs_env, doc):
    cp, standins, shell, env = docs_env
    for block in blocks(doc, "test"):
        run_block(block, standins, shell, env)
    if doc == "README.md":
        # The image the README builds and pushes is the one the chart runs; then the README's uninstall.
        image = cp.kubectl("get", "deployment", "-n", "gpufrac-system", "gpufrac-webhook", "-o",
                           "jsonpath={.spec.template.spec.containers[0].image}", user="admin", check=True).stdout
        assert image == "registry.example.com/gpufrac:0.2.0"
        run_block(Block(doc, 0, README_UNINSTALL, "test", "", ()), standins, shell, env)
        assert cp.kubectl("get", "mutatingwebhookconfiguration", "gpufrac", user="admin").rc != 0
    if doc == "docs/install.md":
        # The certificate Jobs ran for real: the Secret the webhook mounts holds a CA and a serving certificate.
        assert standins.ran and all(r.endswith(": 0") for r in standins.ran), standins.ran
        secret = cp.kubectl("get", "secret", "-n", "gpufrac-system", "gpufrac-webhook-tls", "-o", "yaml",
                            user="admin", check=True)
        assert {"ca.crt", "tls.crt", "tls.key", "ca-bundle.crt"} <= set(yaml.safe_load(secret.stdout)["data"])
    if doc == "docs/operations.md":
        assert cp.kubectl("get", "mutatingwebhookconfiguration", "gpufrac", user="admin").rc != 0
    if doc == "charts/gpufrac/README.md":  # local mode: both configurations call the URL
        url = cp.kubectl("get", "mutatingwebhookconfiguration", "gpufrac", "-o",
                         "jsonpath={.webhooks[0].clientConfig.url}", user="admin", check=True).stdout
        assert url == "https://127.0.0.1:18443/mutate"
