"""Every KAI a cluster may run (issue 25): the shorthands' target as KAI's GetFractionContainerRef picks it, a lone
pod-level compute mode, the compute portion KAI's binder writes at bind, the pods KAI's older GPU-sharing admission
leaves, and devices written as CDI names. KAI's behaviour comes from testkit/kai_oracle.py (modeled from its
source, independent of gpufrac's code)."""

from __future__ import annotations

import jsonpatch
import pytest

from gpufrac.webhook.decide import admission
from testkit.admission import BINDER, POLICY, allowed, created, denial
from testkit.kai_oracle import SHARED_GPU_CONFIGMAP, KaiDeniedError, fraction_container, kai_v017_mutate
from testkit.pods import pod
from testkit.reviews import review

MAIN_HELPER = ("main", "helper")
REQUEST = "nvidia.com/container.{}.gpu-memory.request"
LIMIT = "nvidia.com/container.{}.gpu-memory.limit"
MODE = "nvidia.com/container.{}.gpu-compute.mode"
DEVICES = "nvidia.com/container.{}.gpus.devices"
PORTION = "nvidia.com/container.{}.gpu-compute.portion"
PORTION_LIMIT = "kai.scheduler/container.{}.gpu-memory.portion.limit"
PERCENT = "gpufrac.io/container.{}.active-thread-percent"
LONE_MODE = "kai.scheduler/gpu-compute-sharing-mode"


def fractional_containers(annotations: dict[str, str]) -> set[str]:
    return {k.removeprefix("gpufrac.io/container.").split(".")[0] for k in annotations
            if k.startswith("gpufrac.io/container.")}


# --- The shorthands apply where KAI's GetFractionContainerRef puts them ----------------------------------------

TARGET_CASES = [
    {"gpu-memory": "2000", REQUEST.format("helper"): "2000Mi"},  # the issue's pod
    {"gpu-memory": "2048", MODE.format("helper"): "sm-sharing"},
    {"gpu-fraction": "0.5", MODE.format("helper"): "sm-sharing"},
    {"gpu-fraction": "0.5", MODE.format("main"): "sm-sharing"},
    {"gpu-memory": "1024"},
    {"gpu-fraction": "0.5"},
    {"gpu-fraction": "0.5", "gpu-fraction-container-name": "helper"},
    {"gpu-memory": "2000", "gpu-fraction-container-name": "helper", REQUEST.format("helper"): "2000Mi"},
    {"gpu-memory": "4096", "gpu-memory.limit": "6Gi", MODE.format("helper"): "time-slicing"},
    {"gpu-memory": "2000", "gpu-fraction-container-name": "main", REQUEST.format("helper"): "2000Mi"},  # disagree
    {"gpu-fraction": "0.5", "gpu-fraction-container-name": "main", MODE.format("helper"): "sm-sharing"},
    {"gpu-memory": "1024", MODE.format("main"): "sm-sharing", MODE.format("helper"): "sm-sharing"},  # two named
]


@pytest.mark.parametrize("annotations", TARGET_CASES, ids=[str(i) for i in range(len(TARGET_CASES))])
def test_the_shorthands_target_is_the_container_kai_picks(annotations):
    """Where KAI's admission picks a container, gpufrac gives that one (and only it) the fraction; where KAI denies
    the pod, so does gpufrac."""
    try:
        kai = fraction_container(annotations, list(MAIN_HELPER), [])
    except KaiDeniedError:
        assert not admission.mutate(review(pod(annotations, *MAIN_HELPER)), POLICY).allowed
        return
    assert fractional_containers(created(pod(annotations, *MAIN_HELPER))["metadata"]["annotations"]) == {kai}


def test_the_issues_pod_is_admitted_with_helper_as_the_target():
    annotations = created(pod({"gpu-memory": "2000", REQUEST.format("helper"): "2000Mi"},
                              *MAIN_HELPER))["metadata"]["annotations"]
    assert annotations["gpufrac.io/container.helper.gpu-memory.request-mib"] == "2000"
    assert annotations[REQUEST.format("helper")] == "2000Mi" and REQUEST.format("main") not in annotations


def test_a_container_name_that_disagrees_with_the_keys_is_denied_as_kai_denies_it():
    annotations = {"gpu-memory": "2000", "gpu-fraction-container-name": "main", REQUEST.format("helper"): "2000Mi"}
    with pytest.raises(KaiDeniedError, match="does not match container name helper"):
        fraction_container(annotations, list(MAIN_HELPER), [])
    message = denial(pod(annotations, *MAIN_HELPER))
    assert f"annotation {REQUEST.format('helper')}: 2000Mi names container helper, but gpu-fraction-container-name " \
           "is main" in message


def test_a_portion_limit_on_the_keyed_container_needs_its_name_as_kai_reads_it_for_the_first():
    """KAI's validator reads a portion limit against gpu-fraction-container-name, else containers[0]."""
    message = denial(pod({"gpu-fraction": "0.5", "gpu-fraction.limit": "0.8", MODE.format("helper"): "sm-sharing"},
                         *MAIN_HELPER))
    assert "annotation gpu-fraction.limit: 0.8 applies to container helper" in message
    assert "set gpu-fraction-container-name to helper" in message
    fixed = created(pod({"gpu-fraction": "0.5", "gpu-fraction.limit": "0.8", "gpu-fraction-container-name": "helper",
                         MODE.format("helper"): "sm-sharing"}, *MAIN_HELPER))["metadata"]["annotations"]
    assert fixed[PORTION_LIMIT.format("helper")] == "0.8"


# --- A lone pod-level compute mode is left alone, with a warning -------------------------------------------------


@pytest.mark.parametrize("mode", ["sm-sharing", "time-slicing", "turbo"])
def test_a_lone_pod_level_mode_is_left_untouched_with_a_warning(mode):
    obj = pod({LONE_MODE: mode}, "main", resources={"limits": {"nvidia.com/gpu": "1"}})  # a whole-GPU pod from KAI
    outcome = admission.mutate(review(obj), POLICY)
    assert outcome.allowed and outcome.patch == []
    [warning] = outcome.warnings
    assert warning.startswith(f"annotation {LONE_MODE}: {mode} is ignored: the pod asks for no GPU fraction")
    assert admission.validate(review(obj), POLICY).allowed


def test_a_pod_level_mode_beside_a_wrong_fraction_is_still_judged():
    message = denial(pod({LONE_MODE: "turbo", "gpu-fraction": "2"}, "main"))
    assert f"annotation {LONE_MODE}: turbo must be time-slicing or sm-sharing" in message
    assert "annotation gpu-fraction: 2 must be a decimal number" in message


def test_a_pod_level_mode_beside_a_fraction_still_applies_and_warns_nothing():
    outcome = allowed(pod({LONE_MODE: "sm-sharing", "gpu-fraction": "0.5"}, "main"))
    assert outcome.warnings == []


# --- The compute portion KAI's binder writes at bind ---------------------------------------------------------------


def _ann(key: str) -> str:
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


def bind(old: dict, values: dict[str, str], user: str = BINDER) -> tuple[admission.Outcome, dict]:
    """The binder's merge patch as the two webhooks see it: (the validating outcome, the stored pod)."""
    new = jsonpatch.apply_patch(old, [{"op": "add", "path": _ann(k), "value": v} for k, v in values.items()])
    mutated = admission.mutate(review(new, operation="UPDATE", old=old, user=user), POLICY)
    final = jsonpatch.apply_patch(new, mutated.patch)
    return admission.validate(review(final, operation="UPDATE", old=old, user=user), POLICY), final


def sm_sharing_pod() -> dict:
    return created(pod({"gpu-fraction": "0.5", MODE.format("app"): "sm-sharing"}))


def env(obj: dict, name: str) -> dict:
    return next(e for e in obj["spec"]["containers"][0]["env"] if e["name"] == name)


def test_an_sm_sharing_client_gets_its_percentage_through_a_field_ref_before_the_bind_writes_it():
    stored = sm_sharing_pod()
    field_path = f"metadata.annotations['{PERCENT.format('app')}']"
    assert env(stored, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == {
        "name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": field_path}}}
    assert stored["metadata"]["annotations"][PERCENT.format("app")] == "100"  # no cap until the bind says one
    outcome, bound = bind(stored, {DEVICES.format("app"): "GPU-a", REQUEST.format("app"): "71885Mi",
                                   PORTION.format("app"): "0.5"})
    assert outcome.allowed, outcome.message
    assert bound["metadata"]["annotations"][PERCENT.format("app")] == "50"


@pytest.mark.parametrize(("portion", "percent"), [("1", "100"), ("0.125", "12"), ("0.29", "28"), ("5e-1", "50"),
                                                   ("0.001", "1")])
def test_the_percentage_is_the_portion_floored(portion, percent):
    outcome, bound = bind(sm_sharing_pod(), {DEVICES.format("app"): "GPU-a", REQUEST.format("app"): "1000Mi",
                                             PORTION.format("app"): portion})
    assert outcome.allowed, outcome.message
    assert bound["metadata"]["annotations"][PERCENT.format("app")] == percent


@pytest.mark.parametrize("portion", ["0", "1.5", "50", "-0.5", "NaN", "Inf", "500m", "50%", "", " 0.5"])
def test_a_bad_portion_is_denied_at_bind_naming_the_annotation_the_value_and_what_is_accepted(portion):
    outcome, _ = bind(sm_sharing_pod(), {DEVICES.format("app"): "GPU-a", REQUEST.format("app"): "1000Mi",
                                         PORTION.format("app"): portion})
    assert not outcome.allowed
    assert f"annotation {PORTION.format('app')}: " in outcome.message
    assert "must be a decimal number greater than 0 and at most 1, such as 0.5" in outcome.message


def test_time_slicing_accepts_the_portion_but_caps_nothing():
    stored = created(pod({"gpu-fraction": "0.5"}))
    assert not any(e["name"] == "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" for e in stored["spec"]["containers"][0]["env"])
    outcome, bound = bind(stored, {DEVICES.format("app"): "GPU-a", REQUEST.format("app"): "1000Mi",
                                   PORTION.format("app"): "0.5"})
    assert outcome.allowed, outcome.message
    assert PERCENT.format("app") not in bound["metadata"]["annotations"]
    outcome, _ = bind(stored, {DEVICES.format("app"): "GPU-a", REQUEST.format("app"): "1000Mi",
                               PORTION.format("app"): "2"})
    assert not outcome.allowed  # judged in every mode, as KAI's node agent does


def test_only_the_scheduler_writes_a_portion():
    obj = pod({"gpu-fraction": "0.5", PORTION.format("app"): "0.5"})
    final = jsonpatch.apply_patch(obj, admission.mutate(review(obj), POLICY).patch)
    message = admission.validate(review(final), POLICY).message
    assert f"annotation {PORTION.format('app')}: 0.5 is written by the scheduler at bind" in message
    outcome, _ = bind(sm_sharing_pod(), {PORTION.format("app"): "0.9"}, user="alice")
    assert not outcome.allowed and "only the scheduler may add it, at bind" in outcome.message
    outcome, bound = bind(sm_sharing_pod(), {DEVICES.format("app"): "GPU-a", REQUEST.format("app"): "1000Mi",
                                             PORTION.format("app"): "0.5"})
    changed = jsonpatch.apply_patch(bound, [{"op": "replace", "path": _ann(PORTION.format("app")), "value": "1"}])
    later = admission.validate(review(changed, operation="UPDATE", old=bound, user=BINDER), POLICY)
    assert not later.allowed and "was changed from 0.5" in later.message


def test_a_portion_for_a_container_without_a_fraction_is_denied():
    outcome, _ = bind(created(pod({"gpu-fraction": "0.5"}, *MAIN_HELPER)),
                      {DEVICES.format("main"): "GPU-a", REQUEST.format("main"): "1000Mi",
                       PORTION.format("helper"): "0.5"})
    assert not outcome.allowed and f"annotation {PORTION.format('helper')}: 0.5" in outcome.message


# --- KAI's older GPU-sharing mode ---------------------------------------------------------------------------------


def test_kais_older_admission_after_gpufracs_is_denied_with_the_kai_setting_to_change():
    stored = kai_v017_mutate(created(pod({"gpu-fraction": "0.5"}, "main")))
    assert stored["metadata"]["annotations"][SHARED_GPU_CONFIGMAP] == "p-x7k2q9m-shared-gpu"
    assert env(stored, "NVIDIA_VISIBLE_DEVICES")["valueFrom"]["configMapKeyRef"]["name"] == "p-x7k2q9m-shared-gpu-0"
    outcome = admission.validate(review(stored), POLICY)
    assert not outcome.allowed
    assert f"annotation {SHARED_GPU_CONFIGMAP}: p-x7k2q9m-shared-gpu was written by KAI's admission in its older " \
           "GPU-sharing mode" in outcome.message
    assert "global.gpuSharingMode=NvFractions" in outcome.message and "global.nvFractions.set=true" in outcome.message
    assert "did not run or its changes were undone" not in outcome.message


def test_kais_older_admission_before_gpufracs_is_denied_too():
    first = kai_v017_mutate(pod({"gpu-memory": "2048", "gpu-fraction-container-name": "main"}, "main", "side"))
    outcome = admission.mutate(review(first), POLICY)
    # gpufrac's mutation would replace KAI's env; the pod it would store is judged in the same call and refused
    assert not outcome.allowed and outcome.patch == []
    message = outcome.message
    assert f"annotation {SHARED_GPU_CONFIGMAP}: " in message and "global.gpuSharing=false" in message


def test_kais_configmap_env_without_its_annotation_is_named_too():
    stored = kai_v017_mutate(created(pod({"gpu-fraction": "0.5"}, "main")))
    del stored["metadata"]["annotations"][SHARED_GPU_CONFIGMAP]
    message = admission.validate(review(stored), POLICY).message
    assert "container main: takes env NVIDIA_VISIBLE_DEVICES from ConfigMap p-x7k2q9m-shared-gpu-0" in message
    assert "KAI >= 0.18" in message


# --- Devices written as CDI names ------------------------------------------------------------------------------------


@pytest.mark.parametrize("devices", ["k8s.device-plugin.nvidia.com/gpu=GPU-6f0d3c1e-8a47-4b1e-9a11-0c2d9b2e5f10",
                                     "nvidia.com/gpu=0", "nvidia.com/gpu=GPU-a,nvidia.com/gpu=GPU-b"])
def test_a_bind_may_write_cdi_device_names(devices):
    count = str(len(devices.split(",")))
    stored = created(pod({"gpu-fraction": "0.5", "gpu-fraction-num-devices": count}))
    outcome, bound = bind(stored, {DEVICES.format("app"): devices, REQUEST.format("app"): "1000Mi"})
    assert outcome.allowed, outcome.message
    assert bound["metadata"]["annotations"][DEVICES.format("app")] == devices
    assert bound["metadata"]["annotations"]["gpufrac.io/container.app.mps-pinned-mem-limit"] == \
        ",".join(f"{i}=1000M" for i in range(int(count)))
