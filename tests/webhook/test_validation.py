"""Who may change what, the webhook's own output, and the boundaries a fraction must not reach past."""

from __future__ import annotations

import copy

import jsonpatch
import pytest

from gpufrac.core.contract import Delivery
from gpufrac.webhook.decide import admission
from gpufrac.webhook.decide.policy import Policy
from testkit.admission import BINDER, POLICY
from testkit.pods import INFERENCE, NOTEBOOK, pod
from testkit.reviews import review


def created(annotations, *containers, policy=POLICY, **fields):
    obj = pod(annotations, *containers, **fields)
    outcome = admission.mutate(review(obj), policy)
    assert outcome.allowed, outcome.message
    return jsonpatch.apply_patch(obj, outcome.patch)


def update(old, ops, user="alice", policy=POLICY):
    new = jsonpatch.apply_patch(old, ops)
    mutated = admission.mutate(review(new, operation="UPDATE", old=old, user=user), policy)
    if not mutated.allowed:
        return mutated
    final = jsonpatch.apply_patch(new, mutated.patch)
    return admission.validate(review(final, operation="UPDATE", old=old, user=user), policy)


def ann(key):
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


BIND = [
    {"op": "add", "path": ann("nvidia.com/container.app.gpus.devices"), "value": "GPU-a1b2c3d4,GPU-e5f6a7b8"},
    {"op": "add", "path": ann("nvidia.com/container.app.gpu-memory.request"), "value": "71885Mi"},
    {"op": "add", "path": ann("nvidia.com/container.app.gpu-memory.limit"), "value": "115016Mi"},
]


def test_the_scheduler_binds_a_portion_pod():
    assert update(created(NOTEBOOK), BIND, user=BINDER).allowed


def test_scheduler_groups_are_scheduler_identities_too():
    policy = Policy(scheduler_users=frozenset(), scheduler_groups=frozenset({"system:serviceaccounts:kai-scheduler"}))
    old = created(NOTEBOOK)
    new = jsonpatch.apply_patch(old, BIND)
    outcome = admission.validate(review(new, operation="UPDATE", old=old, user="sa:other",
                                        groups=("system:serviceaccounts:kai-scheduler",)), policy)
    assert not outcome.allowed  # the canonical annotations were not written: the mutation was skipped here
    mutated = admission.mutate(review(new, operation="UPDATE", old=old, user="x",
                                      groups=("system:serviceaccounts:kai-scheduler",)), policy)
    final = jsonpatch.apply_patch(new, mutated.patch)
    assert admission.validate(review(final, operation="UPDATE", old=old, user="x",
                                     groups=("system:serviceaccounts:kai-scheduler",)), policy).allowed


@pytest.mark.parametrize("devices", ["nvidia.com/gpu=all", "GPU-a1b2c3d4,nvidia.com/gpu=all",
                                     "k8s.device-plugin.nvidia.com/gpu=all"])
def test_a_bind_to_every_gpu_by_a_cdi_name_is_denied(devices):
    """A CDI name for all GPUs (NVIDIA's spec has `nvidia.com/gpu=all`) would hand a fraction every GPU of the node."""
    ops = [{**BIND[0], "value": devices}, *BIND[1:]]
    message = update(created(NOTEBOOK), ops, user=BINDER).message
    assert f"annotation nvidia.com/container.app.gpus.devices: {devices} must be a comma-separated list of GPUs" \
           in message and "never a name for all GPUs (bad entry: " in message, message


@pytest.mark.parametrize("devices", ["nvidia.com/gpu=GPU-a1b2c3d4,nvidia.com/gpu=GPU-e5f6a7b8",
                                     "k8s.device-plugin.nvidia.com/gpu=GPU-a1b2c3d4,nvidia.com/gpu=1",
                                     "nvidia.com/gpu=0:1,nvidia.com/gpu=0:2"])
def test_a_bind_by_the_cdi_names_of_single_gpus_is_admitted(devices):
    assert update(created(NOTEBOOK), [{**BIND[0], "value": devices}, *BIND[1:]], user=BINDER).allowed


def test_a_bind_without_memory_for_a_portion_is_denied():
    message = update(created(NOTEBOOK), BIND[:1], user=BINDER).message
    assert "annotation nvidia.com/container.app.gpus.devices: GPU-a1b2c3d4,GPU-e5f6a7b8 assigns devices to container " \
           "app, whose portion request has no memory in MiB yet" in message


def test_users_cannot_do_the_schedulers_binding():
    message = update(created(NOTEBOOK), BIND).message
    assert "annotation nvidia.com/container.app.gpus.devices: GPU-a1b2c3d4,GPU-e5f6a7b8 cannot be added by alice: " \
           "only the scheduler may add it, at bind" in message


@pytest.mark.parametrize(("key", "value"), [
    ("nvidia.com/container.app.gpus.devices", "GPU-ffffffff,GPU-eeeeeeee"),
    ("nvidia.com/container.app.gpu-memory.limit", "120000Mi"),
    ("nvidia.com/container.app.gpu-compute.mode", "sm-sharing"),
    ("gpu-fraction", "0.9"),
])
def test_fraction_annotations_are_immutable_after_bind(key, value):
    bound = update(created(NOTEBOOK), BIND, user=BINDER)
    assert bound.allowed
    old = created(NOTEBOOK)
    old = jsonpatch.apply_patch(old, BIND)
    old = jsonpatch.apply_patch(old, admission.mutate(review(old, operation="UPDATE", old=created(NOTEBOOK),
                                                             user=BINDER), POLICY).patch)
    for who in ("alice", BINDER):
        message = update(old, [{"op": "replace", "path": ann(key), "value": value}], user=who).message
        assert f"annotation {key}: {value} was changed from" in message
        assert "cannot change after the pod is created" in message


def test_the_scheduler_cannot_change_an_absolute_request():
    message = update(created(INFERENCE), [{"op": "add", "path": ann("nvidia.com/container.app.gpus.devices"),
                                           "value": "GPU-a1b2c3d4,GPU-b1b2c3d4,GPU-c1b2c3d4,GPU-d1b2c3d4"},
                                          {"op": "replace", "path": ann("nvidia.com/container.app.gpu-memory.limit"),
                                           "value": "80Gi"}], user=BINDER).message
    assert "annotation nvidia.com/container.app.gpu-memory.limit: 80Gi was changed from 60Gi" in message
    assert "gpus.devices" not in message


def test_removing_every_fraction_key_is_denied():
    old = created(INFERENCE)
    ops = [{"op": "remove", "path": ann(k)} for k in INFERENCE]
    message = update(old, ops).message
    for key in INFERENCE:
        assert f"annotation {key}: " in message and "was removed" in message


def test_an_unrelated_label_may_change():
    assert update(created(INFERENCE), [{"op": "add", "path": "/metadata/labels/team", "value": "a"}]).allowed


@pytest.mark.parametrize("op", [
    {"op": "replace", "path": ann("gpufrac.io/container.app.gpu-memory.limit-mib"), "value": "999999"},
    {"op": "remove", "path": ann("gpufrac.io/container.app.mps-pinned-mem-limit")},
    {"op": "add", "path": ann("gpufrac.io/container.app.extra"), "value": "1"},
])
def test_the_webhooks_own_annotations_cannot_be_touched(op):
    message = update(created(INFERENCE), [op]).message
    assert "annotation gpufrac.io/container.app." in message


def test_the_fractional_label_cannot_be_removed():
    message = update(created(INFERENCE), [{"op": "remove", "path": "/metadata/labels/gpufrac.io~1fractional"}]).message
    assert "label gpufrac.io/fractional: is set by gpufrac and cannot be changed or removed" in message


def test_adding_a_fraction_to_a_running_pod_is_denied():
    plain = pod({})
    message = update(plain, [{"op": "add", "path": ann("gpu-fraction"), "value": "0.5"}]).message
    assert "annotation gpu-fraction: 0.5 cannot be added by alice" in message


def test_a_pod_that_skipped_the_mutating_webhook_is_denied():
    message = admission.validate(review(pod(INFERENCE)), POLICY).message
    assert "annotation gpufrac.io/container.app.gpu-memory.limit-mib: must be 61440, as gpufrac computes it from the "\
           "fraction annotations, but it is missing" in message
    assert "container app: lacks what gpufrac injects (NVIDIA_VISIBLE_DEVICES" in message
    assert "label gpufrac.io/fractional: must be true" in message


def test_injected_env_undone_by_a_later_webhook_is_denied():
    final = created(INFERENCE)
    final["spec"]["containers"][0]["env"] = [e for e in final["spec"]["containers"][0]["env"]
                                             if e["name"] != "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]
    message = admission.validate(review(final), POLICY).message
    assert "container app: lacks what gpufrac injects (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)" in message


def test_whole_gpus_in_another_container_of_a_fractional_pod_are_denied():
    obj = created(INFERENCE, "app", "trainer")
    obj["spec"]["containers"][1]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    assert "container trainer: asks for whole GPUs" in admission.validate(review(obj), POLICY).message


@pytest.mark.parametrize(("env", "fragment"), [
    ({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, "container sidecar: sets NVIDIA_VISIBLE_DEVICES"),
    ({"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/run/gpufrac/mps/sm-sharing"}, "sets CUDA_MPS_PIPE_DIRECTORY"),
    ({"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": "1"}, "sets NVIDIA_GPU_MEMORY_LIMIT"),
])
def test_other_containers_cannot_claim_gpus_or_limits(env, fragment):
    obj = pod(INFERENCE, "app", "sidecar")
    obj["spec"]["containers"][1]["env"] = [env]
    outcome = admission.mutate(review(obj), POLICY)
    final = jsonpatch.apply_patch(obj, outcome.patch)
    assert fragment in admission.validate(review(final), POLICY).message


def test_other_containers_may_say_no_gpu():
    obj = pod(INFERENCE, "app", "sidecar")
    obj["spec"]["containers"][1]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]
    final = jsonpatch.apply_patch(obj, admission.mutate(review(obj), POLICY).patch)
    assert admission.validate(review(final), POLICY).allowed


def test_mps_directories_cannot_be_mounted_by_hand():
    obj = created(INFERENCE, "app", "sidecar")
    obj["spec"]["volumes"].append({"name": "sneaky", "hostPath": {"path": "/run/gpufrac"}})
    obj["spec"]["containers"][1]["volumeMounts"] = [{"name": "gpufrac-mps-sm-sharing", "mountPath": "/mps"}]
    message = admission.validate(review(obj), POLICY).message
    assert "volume sneaky: mounts /run/gpufrac, the node's MPS directories" in message
    assert "container sidecar: mounts the sm-sharing MPS directory but is not a sm-sharing fraction" in message


def test_debug_containers_cannot_reach_the_gpu_or_the_mps_pipes():
    old = created(INFERENCE)
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [{"name": "dbg", "image": "cuda", "env": [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        "volumeMounts": [{"name": "gpufrac-mps-sm-sharing", "mountPath": "/mps"}]}]
    message = admission.validate(review(new, operation="UPDATE", old=old, sub_resource="ephemeralcontainers"),
                                 POLICY).message
    assert "ephemeral container dbg: sets NVIDIA_VISIBLE_DEVICES" in message
    assert "ephemeral container dbg: mounts the sm-sharing MPS directory" in message


def test_fraction_keys_cannot_ride_a_binding():
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p", "annotations": {
        "nvidia.com/container.app.gpus.devices": "GPU-a1b2c3d4"}}, "target": {"kind": "Node", "name": "n1"}}
    for who in ("alice", BINDER):
        message = admission.validate(review(binding, sub_resource="binding", user=who), POLICY).message
        assert "annotation nvidia.com/container.app.gpus.devices: GPU-a1b2c3d4 cannot be set through a Binding" \
               in message
    binding["metadata"]["annotations"] = {"unrelated": "x"}
    assert admission.validate(review(binding, sub_resource="binding"), POLICY).allowed


def test_fraction_annotations_cannot_change_through_pods_status():
    old = created(INFERENCE)
    new = jsonpatch.apply_patch(old, [
        {"op": "replace", "path": ann("gpufrac.io/container.app.gpu-memory.limit-mib"), "value": "143770"},
        {"op": "remove", "path": "/metadata/labels/gpufrac.io~1fractional"}])
    message = admission.validate(review(new, operation="UPDATE", old=old, sub_resource="status"), POLICY).message
    assert "annotation gpufrac.io/container.app.gpu-memory.limit-mib: 143770 cannot be changed through pods/status" \
        in message
    assert "label gpufrac.io/fractional: cannot be changed through pods/status" in message
    status_only = copy.deepcopy(old)
    status_only["status"] = {"phase": "Running"}
    assert admission.validate(review(status_only, operation="UPDATE", old=old, sub_resource="status"), POLICY).allowed


@pytest.mark.parametrize("capability", ["ALL", "sys_admin", "CAP_SYS_ADMIN"])
def test_escalating_capabilities_in_any_spelling_are_denied(capability):
    obj = created(INFERENCE, "app", "sidecar")
    obj["spec"]["containers"][1]["securityContext"] = {"capabilities": {"add": [capability]}}
    assert f"container sidecar: adds {capability}" in admission.validate(review(obj), POLICY).message


def test_a_privileged_sidecar_of_a_fractional_pod_is_denied():
    obj = created(INFERENCE, "app", "sidecar")
    obj["spec"]["containers"][1]["securityContext"] = {"privileged": True}
    assert "container sidecar: is privileged" in admission.validate(review(obj), POLICY).message


def test_volumes_of_gpufracs_csi_driver_are_written_by_gpufrac_only():
    obj = created(INFERENCE, "app", "sidecar")
    obj["spec"]["volumes"].append({"name": "extra", "csi": {"driver": "mps.gpufrac.io",
                                                            "volumeAttributes": {"mode": "time-slicing"}}})
    message = admission.validate(review(obj), POLICY).message
    assert "volume extra: uses gpufrac's CSI driver mps.gpufrac.io; gpufrac writes the one volume" in message


def test_the_csi_volume_must_be_the_one_gpufrac_wrote():
    obj = created(INFERENCE)
    volume = obj["spec"]["volumes"][0]
    volume["csi"]["volumeAttributes"]["mode"] = "time-slicing"
    message = admission.validate(review(obj), POLICY).message
    assert "container app: lacks what gpufrac injects (the gpufrac-mps-sm-sharing volume mount at " \
           "/run/gpufrac/mps/sm-sharing, the gpufrac-mps-sm-sharing volume mount at /dev/shm)" in message


def test_hostpath_delivery_guards_the_shared_memory_directory_too():
    policy = Policy(delivery=Delivery.HOST_PATH)
    obj = created(INFERENCE, "app", "sidecar", policy=policy)
    obj["spec"]["volumes"].append({"name": "peek", "hostPath": {"path": "/run/gpufrac/mps/shm/"}})
    obj["spec"]["containers"][1]["volumeMounts"] = [{"name": "gpufrac-mps-shm", "mountPath": "/x"}]
    message = admission.validate(review(obj), policy).message
    assert "volume peek: mounts /run/gpufrac/mps/shm/, the node's MPS directories" in message
    assert "container sidecar: mounts the MPS daemons' shared memory but is not a GPU fraction" in message


# /var/run/gpufrac/mps/time-slicing and /var/run are cases of e2e/denial_corpus.py (tests/webhook/test_denial_corpus.py)
@pytest.mark.parametrize("path", ["//run//gpufrac/", "run/gpufrac"])
def test_aliases_of_the_mps_directories_are_recognised(path):
    obj = created(INFERENCE)
    obj["spec"]["volumes"].append({"name": "alias", "hostPath": {"path": path}})
    assert "volume alias: mounts" in admission.validate(review(obj), POLICY).message
