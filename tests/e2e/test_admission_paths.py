"""How pods reach (or do not reach) the webhook: matchConditions, failurePolicy, dry-run, controllers."""

from __future__ import annotations

import json

import pytest
import yaml

from e2e.names import RELEASE_NAMESPACE, RS_CONTROLLER_USER
from e2e.testing import create, example, get_pod, metric_total, pod, unique
from testkit.pods import IMAGE

pytestmark = pytest.mark.e2e

C = "gpufrac.io/container.app."


def test_pod_without_fraction_keys_is_never_sent_to_the_webhook(cluster, alice, ns):
    before = metric_total(cluster.webhook_metrics())
    name = unique("plain")
    rc, out, err = create(alice, pod(name, {"example.com/owner": "alice"}, namespace=ns))
    assert rc == 0, err
    plain = json.loads(out)
    assert "gpufrac.io/fractional" not in plain["metadata"].get("labels", {})
    rc, _, err = alice("label", "pod", name, "team=research")  # UPDATE without fraction keys either
    assert rc == 0, err
    assert metric_total(cluster.webhook_metrics()) == before, "the API server called the webhook for a plain pod"
    # Control: a fractional pod does move the counter (mutate; its CREATE is validated by the chart's
    # ValidatingAdmissionPolicies, not by a second webhook call), so the check above can fail.
    rc, _, err = create(alice, pod(unique("counted"), {"gpu-fraction": "0.5"}, namespace=ns))
    assert rc == 0, err
    assert metric_total(cluster.webhook_metrics()) >= before + 1


def _reviews(cluster, webhook: str) -> float:
    lines = [line for line in cluster.webhook_metrics().splitlines() if f'webhook="{webhook}"' in line]
    return metric_total("\n".join(lines))


def test_a_fractional_pods_create_and_its_bind_call_one_webhook_each(cluster, alice, binder, ns):
    """Issue 47: failing closed (the chart's defaults), the mutating webhook judges a pod's CREATE and the scheduler's
    bind-time UPDATE whole; the validating webhook is not called on either."""
    name = unique("one-call")
    before = {w: _reviews(cluster, w) for w in ("mutate", "validate")}
    rc, _, err = create(alice, example("notebook-time-slicing.yaml", name, namespace=ns))
    assert rc == 0, err
    rc, _, err = binder("patch", "pod", name, "--type=merge", "-p", json.dumps({"metadata": {"annotations": {
        "nvidia.com/container.app.gpus.devices": "GPU-a,GPU-b",
        "nvidia.com/container.app.gpu-memory.request": "71885Mi",
        "nvidia.com/container.app.gpu-memory.limit": "115016Mi"}}}))
    assert rc == 0, err
    assert get_pod(alice, name)["metadata"]["annotations"][C + "gpu-memory.limit-mib"] == "115016"
    # Without the validating webhook's not-a-scheduler-update gate the bind-time UPDATE reads validate: 1 here.
    assert {w: _reviews(cluster, w) - before[w] for w in before} == {"mutate": 2, "validate": 0}


def test_webhook_down_plain_pods_still_created_fractional_refused(cluster, alice, ns):
    cluster.stop_webhook()
    try:
        rc, _, err = create(alice, pod(unique("plain-while-down"), namespace=ns))
        assert rc == 0, f"a pod without fraction keys must not depend on the webhook: {err}"
        rc, out, err = create(alice, pod(unique("frac-while-down"), {"gpu-fraction": "0.5"}, namespace=ns))
        assert rc != 0, f"failurePolicy Fail: a fractional pod must be refused while the webhook is down: {out}"
        assert 'failed calling webhook "mutate.gpufrac.io"' in err, err
    finally:
        cluster.start_webhook()
    rc, _, err = create(alice, pod(unique("frac-after-restart"), {"gpu-fraction": "0.5"}, namespace=ns))
    assert rc == 0, err


def test_release_namespace_is_never_sent_to_the_webhook(cluster, admin):
    """The chart's namespaceSelector excludes its own namespace (and kube-system): no deadlock on its own pods. A
    server-side dry run goes through admission as a real CREATE does, and leaves the release's namespace, which
    this test does not own, as it was."""
    before = metric_total(cluster.webhook_metrics())
    p = pod("in-release-ns", {"gpu-fraction": "0.5"}, namespace=RELEASE_NAMESPACE)
    rc, out, err = create(admin, p, "--dry-run=server", "-n", RELEASE_NAMESPACE)
    assert rc == 0, err
    assert "gpufrac.io/fractional" not in json.loads(out)["metadata"].get("labels", {})
    assert metric_total(cluster.webhook_metrics()) == before


def test_users_own_value_of_an_injected_env_var_is_replaced_with_a_warning(alice, ns):
    containers = [{"name": "app", "image": IMAGE, "env": [{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/tmp/mine"}]}]
    rc, out, err = create(alice, pod("own-env", {"gpu-fraction": "0.5"}, containers, namespace=ns))
    assert rc == 0, err
    assert "Warning:" in err and "CUDA_MPS_PIPE_DIRECTORY" in err, f"no admission warning: {err!r}"
    env = [e for e in json.loads(out)["spec"]["containers"][0]["env"] if e["name"] == "CUDA_MPS_PIPE_DIRECTORY"]
    assert env == [{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/run/gpufrac/mps/time-slicing"}]


def test_server_dry_run_shows_the_mutation_and_stores_nothing(alice, tmp_path, ns):
    name = unique("dry-run")
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(
        yaml.safe_dump(
            pod(
                name,
                {
                    "nvidia.com/container.app.gpu-memory.request": "20Gi",
                    "nvidia.com/container.app.gpu-compute.mode": "sm-sharing",
                },
                namespace=ns,
            )
        )
    )
    rc, out, err = alice("apply", "--dry-run=server", "-o", "yaml", "-f", str(manifest))
    assert rc == 0, err
    shown = yaml.safe_load(out)
    ann = shown["metadata"]["annotations"]
    assert ann[C + "gpu-memory.request-mib"] == "20480"
    assert ann[C + "gpu-memory.limit-mib"] == "20480"
    assert ann[C + "mps-pinned-mem-limit"] == "0=20480M"
    assert ann[C + "compute-mode"] == "sm-sharing"
    assert shown["metadata"]["labels"]["gpufrac.io/fractional"] == "true"
    rc, _, err = alice("get", "pod", name)
    assert rc != 0 and "NotFound" in err, "a dry run stored the pod"


def test_deployment_pod_created_like_the_replicaset_controller_is_mutated(alice, admin, ns):
    """No controller-manager runs here, so nothing turns the Deployment into pods. We create its ReplicaSet
    and then the pod exactly the way the ReplicaSet controller would (generateName, ownerReferences to the
    ReplicaSet, the template's metadata and spec), as the controller's own identity (admin impersonating
    system:serviceaccount:kube-system:replicaset-controller, whose RBAC the API server bootstraps), and show
    that this pod is mutated like one a user creates."""
    name = unique("trainer")
    labels = {"app": name}
    template = {
        "metadata": {
            "labels": labels,
            "annotations": {"gpu-fraction": "0.25", "gpu-fraction-num-devices": "2"},
        },
        "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "app", "image": IMAGE}]},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": template},
    }
    rc, out, err = create(alice, deployment)
    assert rc == 0, err
    dep = json.loads(out)
    rs_labels = {**labels, "pod-template-hash": "5d8f7c9b6"}
    replicaset = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": f"{name}-5d8f7c9b6",
            "namespace": ns,
            "labels": rs_labels,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": name,
                    "uid": dep["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": rs_labels},
            "template": {**template, "metadata": {**template["metadata"], "labels": rs_labels}},
        },
    }
    as_controller = (
        "--as",
        RS_CONTROLLER_USER,
        "--as-group",
        "system:serviceaccounts",
        "--as-group",
        "system:serviceaccounts:kube-system",
    )
    rc, out, err = create(
        admin,
        replicaset,
        "--as",
        "system:serviceaccount:kube-system:deployment-controller",
        "--as-group",
        "system:serviceaccounts",
        "--as-group",
        "system:serviceaccounts:kube-system",
    )
    assert rc == 0, err
    rs = json.loads(out)
    rs_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{rs['metadata']['name']}-",
            "namespace": ns,
            "labels": rs_labels,
            "annotations": template["metadata"]["annotations"],
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": rs["metadata"]["name"],
                    "uid": rs["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": template["spec"],
    }
    rc, out, err = create(admin, rs_pod, *as_controller)
    assert rc == 0, err
    created = json.loads(out)
    assert created["metadata"]["name"].startswith(f"{name}-5d8f7c9b6-")
    p = get_pod(alice, created["metadata"]["name"])
    assert p["metadata"]["labels"]["gpufrac.io/fractional"] == "true"
    assert p["metadata"]["annotations"][C + "compute-mode"] == "time-slicing"
    env = {e["name"] for e in p["spec"]["containers"][0].get("env", [])}
    assert {"NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY"} <= env
