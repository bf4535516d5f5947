"""The whole rendered chart is accepted by the real kube-apiserver (`kubectl apply --dry-run=server`)."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from e2e.cluster import CHART_DIR, RELEASE_NAMESPACE, ControlPlane

pytestmark = pytest.mark.e2e


def render(cluster: ControlPlane, *values: str) -> str:
    argv = [str(cluster.tools.helm), "template", "gpufrac", str(CHART_DIR), "--namespace", RELEASE_NAMESPACE,
            "--kube-version", cluster.server_version, *values]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout


@pytest.mark.parametrize("values", [[], ["--set", "webhook.failurePolicy=Ignore", "--set", "agent.enabled=false"]],
                         ids=["defaults", "ignore-no-agent"])
def test_the_rendered_chart_is_accepted_by_the_apiserver(cluster, admin, values):
    manifest = render(cluster, *values)
    kinds = {doc["kind"] for doc in yaml.safe_load_all(manifest) if doc}
    assert {"Deployment", "Service", "PodDisruptionBudget", "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration", "CronJob", "Job"} <= kinds
    assert ("DaemonSet" in kinds) == (values == [])
    result = admin("apply", "--dry-run=server", "-n", RELEASE_NAMESPACE, "-f", "-", input=manifest)
    assert result.rc == 0, result.stderr
    assert "(server dry run)" in result.stdout
    # Nothing was stored: the chart's Deployment does not exist.
    assert admin("get", "deployment", "-n", RELEASE_NAMESPACE, "gpufrac-webhook").rc != 0
