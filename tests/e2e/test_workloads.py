"""Workloads judged at `kubectl apply` through the real API server (README, "Workloads, judged when they are
applied"): wrong templates are denied at once with the pod's message and where the template is; valid ones are
admitted unchanged; the pods their controllers create are mutated as any pod."""

from __future__ import annotations

import json

import pytest
import yaml

from e2e.testing import metric_total
from testkit.pods import EXAMPLES

pytestmark = pytest.mark.e2e

WORKLOADS = EXAMPLES / "workloads"
DENIED = 'admission webhook "validate-workloads.gpufrac.io" denied the request: '
CONTROLLER = "system:serviceaccount:kube-system:{}-controller"


def documents(name: str) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all((WORKLOADS / name).read_text())}


@pytest.fixture
def workload_rights(admin, ns) -> None:
    """alice may manage every workload kind in the test's namespace (the harness grants Deployments and
    ReplicaSets)."""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "alice-all-workloads", "namespace": ns},
            "rules": [{"apiGroups": ["apps"], "resources": ["statefulsets", "daemonsets"], "verbs": ["*"]},
                      {"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": ["*"]},
                      {"apiGroups": [""], "resources": ["podtemplates"], "verbs": ["*"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "alice-all-workloads", "namespace": ns},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "alice-all-workloads"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]}
    for obj in (role, binding):
        rc, _, err = admin("apply", "-f", "-", input=json.dumps(obj))
        assert rc == 0, err


@pytest.mark.parametrize(("kind", "message"), [
    ("Deployment", "spec.template: annotation gpu-fraction: 1.5 must be a decimal number strictly between 0 and 1"),
    ("StatefulSet", "spec.template: pod: asks for GPU fractions in 2 containers (app, sidecar); KAI's binder binds "
                    "the fraction of one container per pod"),
    ("Job", "spec.template: annotation gpu-memory.limit: 2Gi must not be smaller than gpu-memory (4096 MiB)"),
    ("CronJob", "spec.jobTemplate.spec.template: annotation gpu-fraction-container-name: trainer must name a "
                "container of the pod: app"),
])
def test_a_wrong_workload_is_denied_at_apply_with_the_message(alice, workload_rights, kind, message):
    rc, out, err = alice("apply", "-f", "-", input=json.dumps(documents("wrong-workloads.yaml")[kind]))
    assert rc != 0, out
    assert DENIED + message in err, err
    rc, out, _ = alice("get", kind.lower(), documents("wrong-workloads.yaml")[kind]["metadata"]["name"])
    assert rc != 0, f"the {kind} was stored: {out}"


def test_the_readme_example_denies_every_document_of_the_file(alice, workload_rights):
    rc, _, err = alice("apply", "-f", str(WORKLOADS / "wrong-workloads.yaml"))
    assert rc != 0
    assert err.count(DENIED) == 4, err


def test_valid_workloads_are_admitted_and_never_mutated(alice, workload_rights):
    rc, out, err = alice("apply", "-f", str(WORKLOADS / "fractional-workloads.yaml"))
    assert rc == 0, err
    for kind, name in (("deployment", "notebook"), ("statefulset", "inference"), ("job", "evaluate"),
                       ("cronjob", "nightly-eval")):
        assert f"{kind}.{'batch' if kind in ('job', 'cronjob') else 'apps'}/{name} created" in out, out
    rc, out, err = alice("get", "job", "evaluate", "-o", "json")
    assert rc == 0, err
    annotations = json.loads(out)["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"gpu-memory": "2048", "kai.scheduler/gpu-compute-sharing-mode": "time-slicing"}


def test_an_update_is_judged_when_it_changes_the_template(alice, workload_rights):
    alice("apply", "-f", str(WORKLOADS / "fractional-workloads.yaml"))
    patch = {"spec": {"template": {"metadata": {"annotations": {"gpu-fraction": "2"}}}}}
    rc, _, err = alice("patch", "deployment", "notebook", "--type=merge", "-p", json.dumps(patch))
    assert rc != 0 and DENIED + "spec.template: annotation gpu-fraction: 2 must be" in err, err
    rc, _, err = alice("label", "deployment", "notebook", "team=vision", "--overwrite")
    assert rc == 0, err


def test_workloads_without_fractions_never_reach_the_webhook(alice, cluster, workload_rights):
    before = metric_total(cluster.webhook_metrics())
    plain = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "plain-job"},
             "spec": {"template": {"metadata": {"annotations": {"team": "a"}},
                                   "spec": {"restartPolicy": "Never",
                                            "containers": [{"name": "app", "image": "busybox"}]}}}}
    rc, _, err = alice("apply", "-f", "-", input=json.dumps(plain))
    assert rc == 0, err
    assert metric_total(cluster.webhook_metrics()) == before, "the API server called the webhook for a plain Job"


@pytest.mark.parametrize(("source", "controller", "expected"), [
    ("Deployment", "replicaset", {"kai.scheduler/container.app.gpu-memory.portion.limit": "0.8",
                                  "gpufrac.io/container.app.compute-mode": "time-slicing"}),
    ("Job", "job", {"nvidia.com/container.app.gpu-memory.request": "2Gi",
                    "nvidia.com/container.app.gpu-compute.mode": "time-slicing",
                    "gpufrac.io/container.app.gpu-memory.request-mib": "2048"}),
])
def test_pods_created_by_the_controllers_are_mutated_as_today(admin, workload_rights, source, controller, expected):
    """No controller-manager runs here: the pod a controller would create from the admitted template is created
    with the controller's identity (impersonated), as the ReplicaSet and Job controllers do."""
    template = documents("fractional-workloads.yaml")[source]["spec"]["template"]
    name = f"{source.lower()}-pod-by-{controller}"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {**template["metadata"], "name": name},
           "spec": template["spec"]}
    rc, out, err = admin("create", "-f", "-", "-o", "json",
                         f"--as={CONTROLLER.format(controller)}", "--as-group=system:serviceaccounts",
                         "--as-group=system:serviceaccounts:kube-system", "--as-group=system:authenticated",
                         input=json.dumps(pod))
    assert rc == 0, err
    created = json.loads(out)
    annotations = created["metadata"]["annotations"]
    assert {k: annotations.get(k) for k in expected} == expected
    assert created["metadata"]["labels"]["gpufrac.io/fractional"] == "true"
    env = {e["name"] for e in created["spec"]["containers"][0]["env"]}
    assert {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_GPU_MEMORY_LIMIT", "CUDA_MPS_PIPE_DIRECTORY"} <= env
