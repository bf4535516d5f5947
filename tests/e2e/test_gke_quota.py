"""GKE admits the system-*-critical priority classes outside kube-system only under a ResourceQuota scoped to them
(its ResourceQuota admission configuration limits pods of those classes: the `gcp-critical-pods` error). A
kube-apiserver configured the same way shows the chart's pods refused without `criticalPodsQuota.enabled` and
admitted with it."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from e2e.cluster import ControlPlane
from e2e.names import CHART_DIR, RELEASE_NAMESPACE
from e2e.state import private_workdir
from e2e.toolkit.errors import ToolsMissingError
from e2e.toolkit.tools import Tools

pytestmark = pytest.mark.e2e

CRITICAL = ["system-node-critical", "system-cluster-critical"]
ADMISSION_CONFIG = {
    "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
    "plugins": [{"name": "ResourceQuota", "configuration": {
        "apiVersion": "apiserver.config.k8s.io/v1", "kind": "ResourceQuotaConfiguration",
        "limitedResources": [{"resource": "pods", "matchScopes": [
            {"scopeName": "PriorityClass", "operator": "In", "values": CRITICAL}]}]}}],
}


@pytest.fixture(scope="module")
def gke_like(tmp_path_factory):
    try:
        tools = Tools.find()
    except ToolsMissingError as exc:
        pytest.skip(str(exc))
    config = tmp_path_factory.mktemp("gke") / "admission.yaml"
    config.write_text(yaml.safe_dump(ADMISSION_CONFIG))
    cp = ControlPlane(private_workdir("gke"), tools=tools, register_webhook=False,
                      apiserver_flags=(f"--admission-control-config-file={config}",))
    cp.start()
    cp.stop_webhook()
    yield cp
    cp.stop()
    shutil.rmtree(cp.workdir, ignore_errors=True)


def rendered(cp: ControlPlane, *values: str) -> list[dict]:
    out = subprocess.run([cp.tools.helm, "template", "gpufrac", str(CHART_DIR), "--namespace", RELEASE_NAMESPACE,
                          "--kube-version", cp.server_version, *values],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def pod_of(workload: dict) -> dict:
    """The Pod its controller would create."""
    template = workload["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": f"{workload['metadata']['name']}-", "namespace": RELEASE_NAMESPACE,
                         "labels": template["metadata"]["labels"]},
            "spec": template["spec"]}


def create(cp: ControlPlane, obj: dict):
    return cp.kubectl("create", "-f", "-", input=json.dumps(obj), user="admin")


def test_critical_pods_need_the_quota_and_get_in_with_it(gke_like):
    cp = gke_like
    objs = rendered(cp, "--set", "criticalPodsQuota.enabled=true")
    for sa in (o for o in objs if o["kind"] == "ServiceAccount" and "helm.sh/hook" not in
               o["metadata"].get("annotations", {})):
        assert create(cp, sa).rc == 0
    workloads = [o for o in objs if o["kind"] in ("Deployment", "DaemonSet")]
    assert {w["spec"]["template"]["spec"]["priorityClassName"] for w in workloads} == set(CRITICAL)

    for workload in workloads:
        refused = create(cp, pod_of(workload))
        assert refused.rc != 0 and "insufficient quota to match these scopes" in refused.stderr, refused.stderr

    (quota,) = [o for o in objs if o["kind"] == "ResourceQuota"]
    assert create(cp, quota).rc == 0
    # What the resource-quota controller would write before the quota can admit anything.
    status = {"status": {"hard": quota["spec"]["hard"], "used": {"pods": "0"}}}
    patched = cp.kubectl("patch", "resourcequota", quota["metadata"]["name"], "-n", RELEASE_NAMESPACE,
                         "--subresource=status", "--type=merge", "-p", json.dumps(status), user="admin")
    assert patched.rc == 0, patched.stderr

    for workload in workloads:
        admitted = create(cp, pod_of(workload))
        assert admitted.rc == 0, admitted.stderr
    # Pods of other classes were never limited.
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain", "namespace": RELEASE_NAMESPACE},
             "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    assert create(cp, plain).rc == 0
