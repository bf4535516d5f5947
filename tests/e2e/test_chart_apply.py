"""The whole rendered chart is accepted by the real kube-apiserver (`kubectl apply --dry-run=server`): with the
default values and with each optional part on. The Prometheus Operator and cert-manager objects are checked
against those projects' own CRDs, fetched from the Go module proxy at test time (e2e/crds.py) and installed on
the control plane."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from e2e.cluster import ControlPlane
from e2e.crds import CERT_MANAGER, PROMETHEUS_OPERATOR, crd_files
from e2e.kubectl import KubectlResult
from e2e.names import CHART_DIR, RELEASE_NAMESPACE

pytestmark = pytest.mark.e2e

MONITORING_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
MONITORING_ON = ["--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.podMonitor.enabled=true",
                 "--set", "monitoring.prometheusRule.enabled=true", "--set", "monitoring.dashboard.enabled=true"]
CASES = {
    "defaults": [],
    "ignore-no-agent": ["--set", "webhook.failurePolicy=Ignore", "--set", "agent.enabled=false"],
    "monitoring": MONITORING_ON,
    "cert-manager": ["--set", "certs.mode=cert-manager"],
    "critical-pods-quota": ["--set", "criticalPodsQuota.enabled=true"],
    "network-policy": ["--set", "networkPolicy.enabled=true"],
}
# What each case must add to the default objects.
EXPECTED = {
    "monitoring": {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"},
    "cert-manager": {"Issuer", "Certificate"},
    "critical-pods-quota": {"ResourceQuota"},
    "network-policy": {"NetworkPolicy"},
}


def helm_env(cluster: ControlPlane) -> dict[str, str]:
    home = cluster.workdir / "helm"
    return {**os.environ, "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data")}


def helm(cluster: ControlPlane, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(cluster.tools.helm), *args], capture_output=True, text=True, check=check,
                          timeout=120, env=helm_env(cluster))


def served_kinds(admin, group: str) -> set[str]:
    out = admin("api-resources", f"--api-group={group}", "--no-headers")
    assert out.rc == 0, out.stderr
    return {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}


def api_versions(admin) -> list[str]:
    """What helm reads from a live cluster's discovery: the group/versions, and group/version/Kind of the
    monitoring kinds (the chart asks for those by kind)."""
    versions = [f"monitoring.coreos.com/v1/{kind}" for kind in served_kinds(admin, "monitoring.coreos.com")]
    out = admin("api-versions")
    assert out.rc == 0, out.stderr
    return [*out.stdout.split(), *versions]


def render(cluster: ControlPlane, admin, *values: str) -> str:
    argv = ["template", "gpufrac", str(CHART_DIR), "--namespace", RELEASE_NAMESPACE,
            "--kube-version", cluster.server_version, *values]
    for version in api_versions(admin):
        argv += ["--api-versions", version]
    return helm(cluster, *argv).stdout


@pytest.fixture(scope="module")
def upstream_crds(cluster) -> list[Path]:
    """The upstream CRDs (cluster-scoped: no namespace of a test's), as the cluster's admin."""
    def admin(*args: str) -> KubectlResult:
        return cluster.kubectl(*args, user="admin")


    files = [*crd_files(PROMETHEUS_OPERATOR), *crd_files(CERT_MANAGER)]
    for path in files:
        # Server-side: the Prometheus Operator's CRDs are too large for the last-applied annotation.
        result = admin("apply", "--server-side", "--force-conflicts", "-f", str(path))
        assert result.rc == 0, result.stderr
    names = [yaml.safe_load(p.read_text())["metadata"]["name"] for p in files]
    result = admin("wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{n}" for n in names])
    assert result.rc == 0, result.stderr
    return files


def install_notes(cluster: ControlPlane, namespace: str, *values: str) -> str:
    """`helm install --dry-run=server` against the control plane: NOTES as a user sees them, nothing stored."""
    result = helm(cluster, "install", "notes-check", str(CHART_DIR), "--dry-run=server", "--namespace", namespace,
                  "--kubeconfig", str(cluster.kubeconfigs["admin"]), *values, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout[result.stdout.index("NOTES:"):]


def test_notes_say_which_monitoring_objects_were_skipped(cluster, admin):
    """Runs before the CRDs are installed (file order): each toggle names its missing kind."""
    notes = install_notes(cluster, RELEASE_NAMESPACE, *MONITORING_ON)
    assert "WARNING" not in notes
    served = served_kinds(admin, "monitoring.coreos.com")
    for kind in MONITORING_KINDS:
        assert (f"has no {kind} (monitoring.coreos.com/v1)" in notes) == (kind not in served), notes


@pytest.mark.parametrize("case", list(CASES))
def test_the_rendered_chart_lints_and_is_accepted_by_the_apiserver(cluster, admin, upstream_crds, case):
    values = CASES[case]
    lint = helm(cluster, "lint", "--strict", str(CHART_DIR), "--namespace", RELEASE_NAMESPACE, *values, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    manifest = render(cluster, admin, *values)
    kinds = {doc["kind"] for doc in yaml.safe_load_all(manifest) if doc}
    assert {"Deployment", "Service", "PodDisruptionBudget", "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration"} <= kinds
    assert ("DaemonSet" in kinds) == (case != "ignore-no-agent")
    assert EXPECTED.get(case, set()) <= kinds, f"{case}: {sorted(kinds)}"
    assert ({"CronJob", "Job"} <= kinds) == (case != "cert-manager")
    result = admin("apply", "--dry-run=server", "-n", RELEASE_NAMESPACE, "-f", "-", input=manifest)
    assert result.rc == 0, result.stderr
    assert "(server dry run)" in result.stdout
    applied = {line.split("/")[0].split(".")[0] for line in result.stdout.splitlines()}  # kind[.group]/name
    for kind in EXPECTED.get(case, ()):
        assert kind.lower() in applied, f"{kind} was not sent to the API server"
    # Nothing was stored: the chart's Deployment does not exist.
    assert admin("get", "deployment", "-n", RELEASE_NAMESPACE, "gpufrac-webhook").rc != 0


def test_monitoring_objects_are_left_out_without_their_crds(cluster, admin):
    """Where the Prometheus Operator is absent the toggles render nothing (and NOTES says so, below)."""
    manifest = helm(cluster, "template", "gpufrac", str(CHART_DIR), "--namespace", RELEASE_NAMESPACE,
                    "--kube-version", cluster.server_version, *MONITORING_ON).stdout
    kinds = {doc["kind"] for doc in yaml.safe_load_all(manifest) if doc}
    assert not kinds & set(MONITORING_KINDS) and "ConfigMap" in kinds


def test_notes_warn_in_default_and_name_real_node_labels(cluster, admin):
    notes = install_notes(cluster, "default", "--set", "allowDefaultNamespace=true")
    assert "WARNING: the release namespace (default) is never sent to the webhook" in notes
    assert "gpufrac.io/enforcement.time-slicing" in notes and "gpufrac.io/enforcement.sm-sharing" in notes
    assert "-L gpufrac.io/enforcement " not in notes and not notes.rstrip().endswith("gpufrac.io/enforcement")
    refused = helm(cluster, "install", "notes-check", str(CHART_DIR), "--dry-run=server", "--namespace", "default",
                   "--kubeconfig", str(cluster.kubeconfigs["admin"]), check=False)
    assert refused.returncode != 0 and "must not be installed into the default namespace" in refused.stderr


def test_notes_are_quiet_once_the_crds_exist(cluster, admin, upstream_crds):
    assert set(MONITORING_KINDS) <= served_kinds(admin, "monitoring.coreos.com")
    assert "monitoring.coreos.com/v1): none was created" not in install_notes(cluster, RELEASE_NAMESPACE,
                                                                                *MONITORING_ON)
