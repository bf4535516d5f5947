"""Beside NVIDIA's device plugin (gpufrac.agent.decide.whole_gpus through nri_decision.decide): the whole GPUs the
kubelet allocated to a container stay its, under each of the device plugin's strategies, while a pod that only names
a GPU in its env still gets none. Allocations come from a checkpoint in the kubelet's own format."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gpufrac.agent.decide.kubelet_allocations import KubeletAllocations, parse_checkpoint, unknown
from gpufrac.agent.decide.whole_gpus import Verdict, is_gpu_cdi_name, judge, named_gpus
from gpufrac.agent.nri.decide.creation import (
    ContainerInfo,
    Injection,
    NodeFacts,
    Outcome,
    PodInfo,
    Policy,
    Refusal,
    RefusalReason,
    decide,
)
from gpufrac.core.annotations import ComputeMode
from testkit.agent import UUID_A, UUID_B, canonical_annotations, container, gpu_info, injected_env

GPUS = (gpu_info(0, UUID_A), gpu_info(1, UUID_B))
POD_UID = "7d3c-whole"
PLUGIN_KIND = "k8s.device-plugin.nvidia.com/gpu"
MOUNT_ROOT = "/var/run/nvidia-container-devices"
IMAGE_ENV = {"CUDA_VERSION": "13.0.1", "NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}


def checkpoint(*entries: tuple[str, str, str, list[str]]) -> str:
    """A checkpoint as the kubelet's device manager writes it (v2: DeviceIDs per NUMA node, AllocResp bytes)."""
    return json.dumps({"Data": {
        "PodDeviceEntries": [{"PodUID": uid, "ContainerName": name, "ResourceName": resource,
                              "DeviceIDs": {"0": ids[:1], "1": ids[1:]} if len(ids) > 1 else {"-1": ids},
                              "AllocResp": "CiQKFk5WSURJQV9WSVNJQkxFX0RFVklDRVM="}
                             for uid, name, resource, ids in entries],
        "RegisteredDevices": {"nvidia.com/gpu": [UUID_A, UUID_B]}}, "Checksum": 2071235553})


def node(*entries: tuple[str, str, str, list[str]]) -> NodeFacts:
    return NodeFacts(GPUS, frozenset({f"{PLUGIN_KIND}={UUID_A}", f"{PLUGIN_KIND}={UUID_B}"}), {},
                     dict.fromkeys(ComputeMode), allocations=parse_checkpoint(checkpoint(*entries)))


def gpus_for(*ids: str, name: str = "cuda", resource: str = "nvidia.com/gpu") -> NodeFacts:
    return node((POD_UID, name, resource, list(ids)))


def pod(namespace: str = "team-a") -> PodInfo:
    return PodInfo(namespace, "whole", POD_UID, {})


def ctr(env: dict[str, str], *, annotations: dict[str, str] | None = None, cdi: tuple[str, ...] = (),
        mounts: tuple[str, ...] = (), name: str = "cuda") -> ContainerInfo:
    return ContainerInfo("c1", name, env, annotations or {}, cdi, mounts)


def untouched(result: Injection | Refusal) -> bool:
    return isinstance(result, Injection) and result.outcome is Outcome.UNTOUCHED and not result.set_env \
        and not result.remove_env and not result.cdi_devices and not result.device_nodes


def voided(result: Injection | Refusal) -> bool:
    return isinstance(result, Injection) and result.outcome is Outcome.VOIDED \
        and dict(result.set_env) == {"NVIDIA_VISIBLE_DEVICES": "void"}


# ---- each of the device plugin's strategies: the allocated container keeps its GPUs ----

KEPT = [
    # envvar: the kubelet merged the Allocate response's env over the image's
    ("envvar", ctr({**IMAGE_ENV, "NVIDIA_VISIBLE_DEVICES": UUID_A}), gpus_for(UUID_A)),
    ("envvar-two-gpus", ctr({"NVIDIA_VISIBLE_DEVICES": f"{UUID_A},{UUID_B}"}), gpus_for(UUID_B, UUID_A)),
    ("envvar-imex-channels-kept", ctr({"NVIDIA_VISIBLE_DEVICES": UUID_A, "NVIDIA_IMEX_CHANNELS": "0"}),
     gpus_for(UUID_A)),
    # the device plugin's own time-slicing: the kubelet allocated replicas, the env names their GPU
    ("envvar-replicas", ctr({"NVIDIA_VISIBLE_DEVICES": UUID_A}), gpus_for(f"{UUID_A}::0", f"{UUID_A}::3")),
    ("envvar-renamed-shared-resource", ctr({"NVIDIA_VISIBLE_DEVICES": UUID_B}),
     gpus_for(f"{UUID_B}::1", resource="nvidia.com/gpu.shared")),
    # deviceIDStrategy=index: the kubelet's IDs are UUIDs, the env names indexes
    ("envvar-index", ctr({"NVIDIA_VISIBLE_DEVICES": "1"}), gpus_for(UUID_B)),
    ("volume-mounts", ctr({"NVIDIA_VISIBLE_DEVICES": MOUNT_ROOT}, mounts=(f"{MOUNT_ROOT}/{UUID_A}", "/data")),
     gpus_for(UUID_A)),
    # cdi-annotations with containerd's CDI: its edits already set the spec's NVIDIA_VISIBLE_DEVICES=void
    ("cdi-annotations", ctr({**IMAGE_ENV, "NVIDIA_VISIBLE_DEVICES": "void"}, annotations={
        "cdi.k8s.io/nvidia-device-plugin_4f1c": f"{PLUGIN_KIND}={UUID_A},k8s.device-plugin.nvidia.com/imex-channel=0"}),
     gpus_for(UUID_A)),
    ("cdi-cri", ctr({"NVIDIA_VISIBLE_DEVICES": "void"}, cdi=(f"{PLUGIN_KIND}={UUID_B}",)), gpus_for(UUID_B)),
    ("cdi-cri-index-names", ctr({}, cdi=(f"{PLUGIN_KIND}=0", f"{PLUGIN_KIND}=1")), gpus_for(UUID_A, UUID_B)),
    # both strategies at once (DEVICE_LIST_STRATEGY=envvar,cdi-cri)
    ("envvar-and-cdi-cri", ctr({"NVIDIA_VISIBLE_DEVICES": UUID_A}, cdi=(f"{PLUGIN_KIND}={UUID_A}",)),
     gpus_for(UUID_A)),
]


@pytest.mark.parametrize(("container_info", "facts"), [c[1:] for c in KEPT], ids=[c[0] for c in KEPT])
def test_what_the_kubelet_allocated_is_left_to_the_device_plugin(container_info: ContainerInfo,
                                                                 facts: NodeFacts) -> None:
    result = decide(pod(), container_info, facts)
    assert untouched(result), result
    assert isinstance(result, Injection) and "the kubelet allocated" in result.note
    # the same container without the allocation: its env grant voided, its CDI devices left to whoever put them there
    bare = decide(pod(), container_info, replace(facts, allocations=KubeletAllocations({})))
    names_env = container_info.env.get("NVIDIA_VISIBLE_DEVICES") not in (None, "void")
    assert voided(bare) if names_env else untouched(bare), bare


def test_a_cuda_image_under_a_cdi_strategy_loses_only_its_env_all() -> None:
    """cdi-annotations read by NVIDIA's runtime (containerd's CDI off): the image's NVIDIA_VISIBLE_DEVICES=all stays
    in the env; the GPU comes from the annotation, so voiding the env takes nothing the kubelet allocated."""
    annotated = ctr(IMAGE_ENV, annotations={"cdi.k8s.io/nvidia-device-plugin_9a": f"{PLUGIN_KIND}={UUID_A}"})
    result = decide(pod(), annotated, gpus_for(UUID_A))
    assert voided(result), result
    assert isinstance(result, Injection) and result.remove_env == () and result.cdi_devices == ()
    assert "come from its CDI devices" in result.note
    listed = ctr({**IMAGE_ENV, "NVIDIA_IMEX_CHANNELS": "0"}, cdi=(f"{PLUGIN_KIND}={UUID_B}",))
    result = decide(pod(), listed, gpus_for(UUID_B))
    assert voided(result) and isinstance(result, Injection) and result.remove_env == ()


def test_kais_reservation_pod_keeps_its_gpu() -> None:
    reservation = PodInfo("kai-resource-reservation", "gpu-reservation-node-1-x7k2", "r-1", {})
    env = ctr({"NVIDIA_VISIBLE_DEVICES": UUID_B}, name="resource-reservation")
    facts = node(("r-1", "resource-reservation", "nvidia.com/gpu", [UUID_B]))
    assert untouched(decide(reservation, env, facts))
    # the same pod without the kubelet's allocation: no GPU by env, whatever its namespace's name
    assert voided(decide(reservation, env, replace(facts, allocations=KubeletAllocations({}))))


# ---- a pod that only names GPUs gets none ----

PLAIN = [
    ("env-all", ctr(IMAGE_ENV)),
    ("env-uuid", ctr({"NVIDIA_VISIBLE_DEVICES": UUID_A})),
    ("volume-mounts-all", ctr({"NVIDIA_VISIBLE_DEVICES": MOUNT_ROOT}, mounts=(f"{MOUNT_ROOT}/all",))),
    ("sidecar", ctr({"NVIDIA_VISIBLE_DEVICES": UUID_A}, name="sidecar")),
]


@pytest.mark.parametrize("container_info", [c[1] for c in PLAIN], ids=[c[0] for c in PLAIN])
def test_a_plain_container_naming_gpus_gets_none(container_info: ContainerInfo) -> None:
    # the kubelet allocated GPUs, but to another container of the pod and to a container of the same name elsewhere
    facts = node((POD_UID, "main", "nvidia.com/gpu", [UUID_A]), ("other-pod", container_info.name,
                                                                 "nvidia.com/gpu", [UUID_A]))
    result = decide(pod(), container_info, facts)
    assert voided(result), result
    assert isinstance(result, Injection) and result.note.startswith("not a GPU fraction: voided NVIDIA_VISIBLE_DEVICES")


def test_another_vendors_resource_allocates_no_nvidia_gpu() -> None:
    assert voided(decide(pod(), ctr({"NVIDIA_VISIBLE_DEVICES": UUID_A}), gpus_for(UUID_A, resource="example.com/fpga")))


# ---- naming more than the allocation ----

BEYOND = [
    ("env-names-another-gpu", ctr({"NVIDIA_VISIBLE_DEVICES": f"{UUID_A},{UUID_B}"}), UUID_B),
    ("pod-spec-env-all-overrides-the-plugins", ctr({"NVIDIA_VISIBLE_DEVICES": "all"}), "all"),
    ("volume-mount-of-another-gpu",
     ctr({"NVIDIA_VISIBLE_DEVICES": MOUNT_ROOT}, mounts=(f"{MOUNT_ROOT}/{UUID_A}", f"{MOUNT_ROOT}/{UUID_B}")), UUID_B),
    ("cdi-name-of-another-gpu", ctr({}, cdi=(f"{PLUGIN_KIND}={UUID_A}", f"nvidia.com/gpu={UUID_B}")),
     f"nvidia.com/gpu={UUID_B}"),
    ("cdi-annotation-all", ctr({}, annotations={"cdi.k8s.io/x": "nvidia.com/gpu=all"}), "nvidia.com/gpu=all"),
]


@pytest.mark.parametrize(("container_info", "extra"), [c[1:] for c in BEYOND], ids=[c[0] for c in BEYOND])
def test_naming_more_than_the_allocation_is_refused_not_voided(container_info: ContainerInfo, extra: str) -> None:
    result = decide(pod(), container_info, gpus_for(UUID_A))
    assert isinstance(result, Refusal), result
    assert result.reason is RefusalReason.BEYOND_ALLOCATION
    assert f"names GPUs {extra} beyond the whole GPUs the kubelet allocated to it ({UUID_A})" in result.message
    assert "container cuda of pod team-a/whole" in result.message


# ---- the checkpoint unknown: fail closed for IDs, as before for the rest ----

def test_unknown_allocations_refuse_ids_and_void_all() -> None:
    problem = "the kubelet's device checkpoint /x does not parse: not JSON"
    facts = replace(gpus_for(UUID_A), allocations=unknown(problem))
    by_id = decide(pod(), ctr({"NVIDIA_VISIBLE_DEVICES": UUID_A}), facts)
    assert isinstance(by_id, Refusal) and by_id.reason is RefusalReason.ALLOCATION_UNKNOWN
    assert "/x does not parse: not JSON" in by_id.message and "the kubelet retries" in by_id.message
    assert voided(decide(pod(), ctr(IMAGE_ENV), facts))  # no device plugin grants `all`
    assert untouched(decide(pod(), ctr({"PATH": "/bin"}), facts))
    assert untouched(decide(pod(), ctr({}, cdi=(f"{PLUGIN_KIND}={UUID_A}",)), facts))  # CDI: left to its author
    trusted = Policy(trusted_namespaces=frozenset({"gpu-operator"}))
    assert decide(pod("gpu-operator"), ctr({"NVIDIA_VISIBLE_DEVICES": UUID_A}), facts, trusted) == \
        Injection(Outcome.UNTOUCHED)


def test_a_fraction_is_decided_by_its_annotations_not_the_checkpoint() -> None:
    annotations = canonical_annotations("cuda", request_mib=2048, limit_mib=4096, devices=[UUID_B])
    env = injected_env(container("cuda", request_mib=2048, limit_mib=4096, devices=(UUID_B,)))
    fraction = PodInfo("team-a", "infer", POD_UID, annotations)
    for facts in (gpus_for(UUID_A), replace(gpus_for(UUID_A), allocations=unknown("unreadable"))):
        result = decide(fraction, ctr(env), facts)
        assert isinstance(result, Injection) and result.cdi_devices == (f"{PLUGIN_KIND}={UUID_B}",)


# ---- the pieces ----

def test_named_gpus_reads_every_channel() -> None:
    named = named_gpus({"NVIDIA_VISIBLE_DEVICES": f" {UUID_A}, 1 "}, {"cdi.k8s.io/a": f"{PLUGIN_KIND}={UUID_B}",
                                                                      "other": "nvidia.com/gpu=0"},
                       ("vendor.com/fpga=0", "nvidia.com/gpu=0"), ())
    assert named.env == (UUID_A, "1")
    assert named.cdi == ("nvidia.com/gpu=0", f"{PLUGIN_KIND}={UUID_B}")
    assert not named_gpus({"NVIDIA_VISIBLE_DEVICES": "none"}, {}, (), (f"{MOUNT_ROOT}/{UUID_A}",))
    assert not named_gpus({"NVIDIA_VISIBLE_DEVICES": MOUNT_ROOT}, {}, (), (f"{MOUNT_ROOT}/imex/0",))


@pytest.mark.parametrize(("name", "gpu"), [
    (f"{PLUGIN_KIND}={UUID_A}", True), ("nvidia.com/gpu=all", True), ("management.nvidia.com/gpu=all", True),
    ("k8s.device-plugin.nvidia.com/imex-channel=0", False), ("k8s.gpu.nvidia.com/claim=x", False),
    ("example.com/gpu=0", False), ("notnvidia.com/gpu=0", False), ("nvidia.com/gpu", False),
])
def test_which_cdi_names_are_nvidia_gpus(name: str, gpu: bool) -> None:
    assert is_gpu_cdi_name(name) is gpu


def test_judge_without_nvml_compares_ids_as_written() -> None:
    allocations = parse_checkpoint(checkpoint((POD_UID, "cuda", "nvidia.com/gpu", [f"{UUID_A}::2"])))
    assert judge(named_gpus({"NVIDIA_VISIBLE_DEVICES": UUID_A}, {}, (), ()), allocations, POD_UID,
                 "cuda").verdict is Verdict.ALLOCATED
    refused = judge(named_gpus({"NVIDIA_VISIBLE_DEVICES": "0"}, {}, (), ()), allocations, POD_UID, "cuda")
    assert (refused.verdict, refused.beyond) == (Verdict.BEYOND, ("0",))  # an index means nothing without NVML
