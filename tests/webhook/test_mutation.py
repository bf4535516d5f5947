"""The mutation: canonical annotations, label, env and mounts; valid Pods; idempotent; warnings on overrides."""

from __future__ import annotations

import copy
import hashlib

import jsonpatch
import kubernetes_validate
import pytest

from gpufrac.core.contract import Delivery, reclaim_backoff_label
from gpufrac.webhook.decide import admission
from gpufrac.webhook.decide.policy import Policy
from testkit.admission import BINDER, POLICY
from testkit.pods import INFERENCE, NOTEBOOK, pod
from testkit.reviews import review

KUBE_VERSION = "1.36.0"


KEEPING_OFF = Policy(keep_off_reclaimed_nodes=True)  # the chart's reclaim.policy evict, reclaim.backoffSeconds > 0


def mutated(obj, policy=POLICY):
    outcome = admission.mutate(review(obj), policy)
    assert outcome.allowed, outcome.message
    return jsonpatch.apply_patch(obj, outcome.patch), outcome


def env_of(container):
    return {e["name"]: e for e in container["env"]}


def field_path(entry):
    return entry["valueFrom"]["fieldRef"]["fieldPath"]


def test_seed_inference_server_gets_its_limits():
    final, outcome = mutated(pod(INFERENCE))
    annotations = final["metadata"]["annotations"]
    assert annotations["gpufrac.io/container.app.gpu-memory.request-mib"] == "40960"
    assert annotations["gpufrac.io/container.app.gpu-memory.limit-mib"] == "61440"
    assert annotations["gpufrac.io/container.app.mps-pinned-mem-limit"] == "0=61440M,1=61440M,2=61440M,3=61440M"
    assert annotations["gpufrac.io/container.app.compute-mode"] == "sm-sharing"
    assert final["metadata"]["labels"] == {"gpufrac.io/fractional": "true"}
    env = env_of(final["spec"]["containers"][0])
    assert field_path(env["NVIDIA_VISIBLE_DEVICES"]) == "metadata.annotations['nvidia.com/container.app.gpus.devices']"
    assert field_path(env["NVIDIA_GPU_MEMORY_REQUEST"]) == \
        "metadata.annotations['gpufrac.io/container.app.gpu-memory.request-mib']"
    assert field_path(env["NVIDIA_GPU_MEMORY_LIMIT"]) == \
        "metadata.annotations['gpufrac.io/container.app.gpu-memory.limit-mib']"
    assert field_path(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]) == \
        "metadata.annotations['gpufrac.io/container.app.mps-pinned-mem-limit']"
    assert env["CUDA_MPS_PIPE_DIRECTORY"]["value"] == "/run/gpufrac/mps/sm-sharing"
    assert final["spec"]["containers"][0]["volumeMounts"] == [
        {"name": "gpufrac-mps-sm-sharing", "mountPath": "/run/gpufrac/mps/sm-sharing", "subPath": "pipe"},
        {"name": "gpufrac-mps-sm-sharing", "mountPath": "/dev/shm", "subPath": "shm"}]
    assert final["spec"]["volumes"] == [{"name": "gpufrac-mps-sm-sharing", "csi": {
        "driver": "mps.gpufrac.io", "volumeAttributes": {"mode": "sm-sharing"}}}], "no hostPath: baseline allows it"
    assert outcome.warnings == []


def test_hostpath_delivery_mounts_the_pipe_and_shared_memory_directories():
    policy = Policy(delivery=Delivery.HOST_PATH)
    final, _ = mutated(pod(INFERENCE), policy)
    assert final["spec"]["containers"][0]["volumeMounts"] == [
        {"name": "gpufrac-mps-sm-sharing", "mountPath": "/run/gpufrac/mps/sm-sharing"},
        {"name": "gpufrac-mps-shm", "mountPath": "/dev/shm"}]
    assert final["spec"]["volumes"] == [
        {"name": "gpufrac-mps-sm-sharing", "hostPath": {"path": "/run/gpufrac/mps/sm-sharing", "type": "Directory"}},
        {"name": "gpufrac-mps-shm", "hostPath": {"path": "/run/gpufrac/mps/shm", "type": "Directory"}}]
    assert admission.mutate(review(final), policy).patch == []
    assert admission.validate(review(final), policy).allowed


def test_a_users_own_dev_shm_is_replaced_with_a_warning():
    obj = pod(INFERENCE)
    obj["spec"]["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    obj["spec"]["containers"][0]["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    final, outcome = mutated(obj)
    mounts = final["spec"]["containers"][0]["volumeMounts"]
    assert [m["mountPath"] for m in mounts] == ["/dev/shm", "/run/gpufrac/mps/sm-sharing"]
    assert mounts[0] == {"name": "gpufrac-mps-sm-sharing", "mountPath": "/dev/shm", "subPath": "shm"}
    assert outcome.warnings == ["container app: the volume mount at /dev/shm was replaced by gpufrac (it carries the "
                                "MPS directories)"]
    assert admission.validate(review(final), POLICY).allowed


def test_seed_notebook_waits_for_bind_time_memory():
    final, _ = mutated(pod(NOTEBOOK))
    annotations = final["metadata"]["annotations"]
    assert annotations["kai.scheduler/container.app.gpu-memory.portion.limit"] == "0.8"
    assert annotations["gpufrac.io/container.app.compute-mode"] == "time-slicing"
    assert "gpufrac.io/container.app.gpu-memory.limit-mib" not in annotations
    env = env_of(final["spec"]["containers"][0])
    assert env["CUDA_MPS_PIPE_DIRECTORY"]["value"] == "/run/gpufrac/mps/time-slicing"


def test_bind_time_update_by_the_scheduler_writes_the_canonical_values():
    created, _ = mutated(pod(NOTEBOOK))
    bound = jsonpatch.apply_patch(created, [
        {"op": "add", "path": "/metadata/annotations/nvidia.com~1container.app.gpus.devices", "value": "GPU-a1b2c3d4,"
                                                                                                     "GPU-e5f6a7b8"},
        {"op": "add", "path": "/metadata/annotations/nvidia.com~1container.app.gpu-memory.request", "value": "71885Mi"},
        {"op": "add", "path": "/metadata/annotations/nvidia.com~1container.app.gpu-memory.limit", "value": "115016Mi"},
    ])
    outcome = admission.mutate(review(bound, operation="UPDATE", old=created, user=BINDER), POLICY)
    assert outcome.allowed, outcome.message
    final = jsonpatch.apply_patch(bound, outcome.patch)
    annotations = final["metadata"]["annotations"]
    assert annotations["gpufrac.io/container.app.gpu-memory.request-mib"] == "71885"
    assert annotations["gpufrac.io/container.app.gpu-memory.limit-mib"] == "115016"
    assert annotations["gpufrac.io/container.app.mps-pinned-mem-limit"] == "0=115016M,1=115016M"
    assert all(op["path"].startswith("/metadata/annotations/") for op in outcome.patch)
    check = admission.validate(review(final, operation="UPDATE", old=created, user=BINDER), POLICY)
    assert check.allowed, check.message


def test_an_update_by_anyone_else_is_not_quietly_repaired():
    created, _ = mutated(pod(INFERENCE))
    tampered = jsonpatch.apply_patch(created, [{"op": "replace", "path": "/metadata/annotations/gpufrac.io~1container"
                                                ".app.gpu-memory.limit-mib", "value": "999999"}])
    assert admission.mutate(review(tampered, operation="UPDATE", old=created), POLICY).patch == []


@pytest.mark.parametrize("annotations", [INFERENCE, NOTEBOOK, {"gpu-memory": "1000", "gpu-memory.limit": "2Gi"}])
def test_mutating_twice_equals_mutating_once(annotations):
    once, _ = mutated(pod(annotations, "app", "sidecar", init=("setup",)))
    outcome = admission.mutate(review(once), POLICY)
    assert outcome.patch == [] and outcome.warnings == []


@pytest.mark.parametrize("annotations", [INFERENCE, NOTEBOOK])
def test_the_mutated_pod_is_a_valid_pod(annotations):
    final, _ = mutated(pod(annotations, "app", "sidecar", init=("setup",)),
                       Policy(require_enforcing_node=True))
    kubernetes_validate.validate(final, KUBE_VERSION, strict=True)


def test_shorthands_are_translated_and_rounded_up_to_whole_mib():
    final, _ = mutated(pod({"gpu-memory": "1000", "gpu-memory.limit": "2000M"}))
    annotations = final["metadata"]["annotations"]
    assert annotations["nvidia.com/container.app.gpu-memory.request"] == "1000Mi"
    assert annotations["nvidia.com/container.app.gpu-memory.limit"] == "2000M"
    assert annotations["gpufrac.io/container.app.gpu-memory.limit-mib"] == "1908"  # 1907.35 MiB, rounded up
    final, _ = mutated(pod({"nvidia.com/container.app.gpu-memory.limit": "1000M"}))
    annotations = final["metadata"]["annotations"]
    assert annotations["gpufrac.io/container.app.gpu-memory.request-mib"] == "954"  # request defaults to the limit
    assert annotations["gpufrac.io/container.app.gpu-memory.limit-mib"] == "954"


def test_a_containers_own_values_are_replaced_with_a_warning():
    obj = pod(INFERENCE, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, {"name": "KEEP", "value": "1"}])
    final, outcome = mutated(obj)
    env = env_of(final["spec"]["containers"][0])
    assert "valueFrom" in env["NVIDIA_VISIBLE_DEVICES"] and env["KEEP"] == {"name": "KEEP", "value": "1"}
    assert outcome.warnings == ["container app: env NVIDIA_VISIBLE_DEVICES was replaced by gpufrac (it carries the "
                                "fraction's limits)"]


def test_user_written_canonical_values_are_replaced_with_a_warning():
    obj = pod({**INFERENCE, "gpufrac.io/container.app.gpu-memory.limit-mib": "999999"})
    final, outcome = mutated(obj)
    assert final["metadata"]["annotations"]["gpufrac.io/container.app.gpu-memory.limit-mib"] == "61440"
    assert any("replaced 999999 with 61440" in w for w in outcome.warnings)


def test_other_containers_of_a_fractional_pod_see_no_gpu():
    final, _ = mutated(pod(INFERENCE, "app", "sidecar", init=("setup",)))
    assert env_of(final["spec"]["containers"][1])["NVIDIA_VISIBLE_DEVICES"] == {"name": "NVIDIA_VISIBLE_DEVICES",
                                                                              "value": "void"}
    assert env_of(final["spec"]["initContainers"][0])["NVIDIA_VISIBLE_DEVICES"]["value"] == "void"


def test_init_containers_can_hold_the_fraction():
    final, _ = mutated(pod({"nvidia.com/container.setup.gpu-memory.request": "2Gi"}, init=("setup",)))
    assert env_of(final["spec"]["initContainers"][0])["CUDA_MPS_PIPE_DIRECTORY"]["value"] == \
        "/run/gpufrac/mps/time-slicing"
    assert env_of(final["spec"]["containers"][0])["NVIDIA_VISIBLE_DEVICES"]["value"] == "void"


def test_required_node_affinity_is_added_to_every_term():
    obj = pod(INFERENCE)
    obj["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                              {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}
    final, _ = mutated(obj, Policy(require_enforcing_node=True))
    terms = final["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    wanted = {"key": "gpufrac.io/enforcement.sm-sharing", "operator": "In", "values": ["driver", "mps"]}
    assert all(wanted in term["matchExpressions"] for term in terms)
    assert admission.mutate(review(final), Policy(require_enforcing_node=True)).patch == []


def test_a_controllers_fractional_pod_is_kept_off_the_nodes_where_reclaim_evicted_one_of_its_pods():
    """The agent labels a node gpufrac.io/reclaimed.<digest of the controller's UID> for the back-off; a fractional
    pod of that controller gets a node affinity that label fails, in every term. A bare pod, a pod whose only owner
    does not control it, and a plain pod get none."""
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "infer-7c9", "uid": "u-rs-1", "controller": True}
    obj = pod(INFERENCE)
    obj["metadata"]["ownerReferences"] = [owner]
    obj["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                              {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}
    final, _ = mutated(copy.deepcopy(obj), KEEPING_OFF)
    terms = final["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    wanted = {"key": reclaim_backoff_label("u-rs-1"), "operator": "DoesNotExist"}
    assert wanted["key"] == "gpufrac.io/reclaimed." + hashlib.sha256(b"u-rs-1").hexdigest()[:16]
    assert all(wanted in term["matchExpressions"] for term in terms) and len(terms) == 2
    assert admission.mutate(review(final), KEEPING_OFF).patch == []  # once is enough
    bare = mutated(pod(INFERENCE), KEEPING_OFF)[0]
    assert "affinity" not in bare["spec"]
    not_controlling = pod(INFERENCE)
    not_controlling["metadata"]["ownerReferences"] = [{**owner, "controller": False}]
    assert "affinity" not in mutated(not_controlling, KEEPING_OFF)[0]["spec"]
    plain = pod({})
    plain["metadata"]["ownerReferences"] = [owner]
    assert "affinity" not in mutated(plain, KEEPING_OFF)[0]["spec"]


def test_no_back_off_affinity_where_no_agent_writes_the_label():
    """F4: reclaim off, or a back-off of 0 (the webhook's default, --no-keep-off-reclaimed-nodes): the agent never
    labels a node for a back-off, so a controller's pod gets no affinity for it."""
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "infer-7c9", "uid": "u-rs-1", "controller": True}
    obj = pod(INFERENCE)
    obj["metadata"]["ownerReferences"] = [owner]
    final, _ = mutated(obj)
    assert "affinity" not in final["spec"]


def test_mps_directories_are_configurable():
    policy = Policy(mps_root="/var/mps", delivery=Delivery.HOST_PATH)
    final, _ = mutated(pod(INFERENCE), policy)
    assert env_of(final["spec"]["containers"][0])["CUDA_MPS_PIPE_DIRECTORY"]["value"] == "/var/mps/sm-sharing"
    assert final["spec"]["volumes"][0]["hostPath"]["path"] == "/var/mps/sm-sharing"


def test_debug_containers_added_to_a_fractional_pod_get_no_gpu():
    created, _ = mutated(pod(INFERENCE))
    debugged = jsonpatch.apply_patch(created, [{"op": "add", "path": "/spec/ephemeralContainers",
                                                "value": [{"name": "debugger", "image": "busybox"}]}])
    outcome = admission.mutate(review(debugged, operation="UPDATE", old=created, sub_resource="ephemeralcontainers"),
                               POLICY)
    final = jsonpatch.apply_patch(debugged, outcome.patch)
    assert final["spec"]["ephemeralContainers"][0]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]


def test_pods_without_fraction_keys_are_untouched():
    outcome = admission.mutate(review(pod({"team": "a"})), POLICY)
    assert outcome.allowed and outcome.patch == []


@pytest.mark.parametrize("change", [
    {"nvidia.com/container.app.gpus.devices": "GPU-a1b2c3d4"},  # the devices changed after the bind
    {"nvidia.com/container.app.gpu-memory.limit": "999999Mi"},  # a limit above what the GPU has
    {"gpufrac.io/unlimited": "true"},  # a key of gpufrac's own
])
def test_a_bad_update_by_the_scheduler_is_denied_by_the_mutating_webhook_as_the_validating_one_would(change):
    """Issue 47: failing closed, the validating webhook is not called on the scheduler's UPDATEs; the mutating one
    judges them whole and says what the validating one would."""
    created, _ = mutated(pod(NOTEBOOK))
    bind = {"nvidia.com/container.app.gpus.devices": "GPU-a1b2c3d4,GPU-e5f6a7b8",
            "nvidia.com/container.app.gpu-memory.request": "71885Mi",
            "nvidia.com/container.app.gpu-memory.limit": "115016Mi"}
    bound_outcome = admission.mutate(review(_annotated(created, bind), operation="UPDATE", old=created, user=BINDER),
                                     POLICY)
    assert bound_outcome.allowed, bound_outcome.message
    bound = jsonpatch.apply_patch(_annotated(created, bind), bound_outcome.patch)
    changed = _annotated(bound, change)
    outcome = admission.mutate(review(changed, operation="UPDATE", old=bound, user=BINDER), POLICY)
    validated = admission.validate(review(changed, operation="UPDATE", old=bound, user=BINDER), POLICY)
    assert not validated.allowed
    assert not outcome.allowed and not outcome.patch
    assert outcome.message == validated.message
    assert next(iter(change)) in outcome.message


def _annotated(obj, annotations):
    result = copy.deepcopy(obj)
    result["metadata"]["annotations"].update(annotations)
    return result
