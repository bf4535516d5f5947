"""The DRA driver's pure decisions: the ResourceSlices it publishes, a claim read from the API object, Prepare's
devices, limits, CDI spec and refusals, and the state file's record."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace
from typing import Any

import pytest

from gpufrac.agent.decide import mps_limits, reclaim
from gpufrac.agent.decide.audit import Snapshot, decide
from gpufrac.agent.decide.events import event_body
from gpufrac.agent.decide.front_door import FrontDoorChoice
from gpufrac.agent.decide.kubelet_allocations import parse_checkpoint
from gpufrac.agent.decide.model import GpuInfo, GpuMemory, GpuProcess, ViolationKind
from gpufrac.agent.decide.mps_namespaces import Namespace, claim_namespace_name, wanted
from gpufrac.agent.dra.decide import state as dra_state
from gpufrac.agent.dra.decide.cdi_dirs import cdi_dir_problem
from gpufrac.agent.dra.decide.claims import ClaimError, ClaimPod, read_claim
from gpufrac.agent.dra.decide.prepare import DraNode, PreparedClaim, cdi_spec, prepare, spec_file_name
from gpufrac.agent.dra.decide.reconcile import reconciled
from gpufrac.agent.dra.decide.shared_claims import ClaimHolder, time_slicing_holders
from gpufrac.agent.dra.decide.slices import DeviceName, SliceGpu, dropped_fields, parse_device_name, resource_slices
from gpufrac.agent.dra.decide.tenants import claim_tenants
from gpufrac.agent.nri.decide.creation import ContainerInfo, NodeFacts, PodInfo, Refusal, RefusalReason
from gpufrac.agent.nri.decide.creation import decide as nri_decide
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import FrontDoor

GIB = 1 << 30
NODE = "node-a"


def gpus(count: int = 2, usable_mib: int = 81_000) -> dict[int, SliceGpu]:
    return {i: SliceGpu(GpuInfo(i, f"GPU-{i}0000000-aaaa", "NVIDIA H100 80GB HBM3", 80 * GIB), usable_mib << 20)
            for i in range(count)}


def node(**changes: Any) -> DraNode:
    values: dict[str, Any] = {"name": NODE, "gpus": gpus(), "mps_root": "/run/gpufrac/mps",
                              "mps_modes": frozenset({"time-slicing", "sm-sharing"}),
                              "cdi_devices": frozenset({"nvidia.com/gpu=GPU-00000000-aaaa", "nvidia.com/gpu=0"}),
                              "host_devices": frozenset({"/dev/nvidiactl", "/dev/nvidia-uvm"})}
    values.update(changes)
    return DraNode(**values)


def claim(device: str, *, uid: str = "uid-1", memory: str | None = "40Gi", compute: str | None = None,
          configs: list[dict[str, Any]] | None = None, pool: str = NODE, driver: str = "gpu.gpufrac.io",
          pods: tuple[tuple[str, str], ...] = (), reserved: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    consumed = {k: v for k, v in (("memory", memory), ("compute", compute)) if v is not None}
    result: dict[str, Any] = {"request": "gpu", "driver": driver, "pool": pool, "device": device,
                              "shareID": "share-" + uid}
    if consumed:
        result["consumedCapacity"] = consumed
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": "team", "name": f"claim-{uid}", "uid": uid},
            "status": {"allocation": {"devices": {"results": [result], "config": configs or []}},
                       "reservedFor": (reserved or []) + [{"resource": "pods", "name": name, "uid": pod_uid}
                                                          for name, pod_uid in pods]}}


def limit_config(limit: str, source: str = "FromClaim", requests: list[str] | None = None,
                 **extra: Any) -> dict[str, Any]:
    parameters = {"apiVersion": "gpu.gpufrac.io/v1alpha1", "kind": "GpuConfig", "memoryLimit": limit, **extra}
    return {"source": source, "requests": requests or [],
            "opaque": {"driver": "gpu.gpufrac.io", "parameters": parameters}}


def prepared(obj: dict[str, Any], at: DraNode | None = None, others: tuple[PreparedClaim, ...] = ()) -> PreparedClaim:
    return prepare(read_claim(obj), at or node(), others)


def env_of(spec: dict[str, Any] | None) -> dict[str, str]:
    assert spec is not None
    [device] = spec["devices"]
    return dict(item.split("=", 1) for item in device["containerEdits"].get("env", []))


# ---- the ResourceSlices ----

def test_slices_publish_a_device_per_mode_and_a_whole_gpu_per_gpu_all_on_one_counter() -> None:
    counters, devices = resource_slices(NODE, gpus().values(), "615.10", generation=3)
    assert counters["spec"]["pool"] == devices["spec"]["pool"] == {"name": NODE, "generation": 3,
                                                                    "resourceSliceCount": 2}
    assert [c["name"] for c in counters["spec"]["sharedCounters"]] == ["gpu-0", "gpu-1"]
    assert "devices" not in counters["spec"] and "sharedCounters" not in devices["spec"]
    by_name = {d["name"]: d for d in devices["spec"]["devices"]}
    assert sorted(by_name) == ["gpu-0", "gpu-0-sm-sharing", "gpu-0-time-slicing",
                               "gpu-1", "gpu-1-sm-sharing", "gpu-1-time-slicing"]
    for name, device in by_name.items():
        index = name.split("-")[1]
        assert device["consumesCounters"] == [{"counterSet": f"gpu-{index}", "counters": {"owner": {"value": "1"}}}]
        assert device["capacity"]["memory"]["value"] == "81000Mi"
    ts, sm, whole = by_name["gpu-0-time-slicing"], by_name["gpu-0-sm-sharing"], by_name["gpu-0"]
    assert ts["allowMultipleAllocations"] and sm["allowMultipleAllocations"] and "allowMultipleAllocations" not in whole
    assert ts["capacity"]["memory"]["requestPolicy"]["validRange"] == {"min": "1Mi", "max": "81000Mi", "step": "1Mi"}
    assert "compute" not in ts["capacity"] and sm["capacity"]["compute"]["value"] == "100"
    assert sm["attributes"]["mode"] == {"string": "sm-sharing"} and whole["attributes"]["mode"] == {"string": "whole"}
    assert sm["attributes"]["uuid"] == {"string": "GPU-00000000-aaaa"}


@pytest.mark.parametrize(("name", "parsed"), [
    ("gpu-0-time-slicing", DeviceName(0, "time-slicing")), ("gpu-12-sm-sharing", DeviceName(12, "sm-sharing")),
    ("gpu-3", DeviceName(3, "whole")), ("gpu-03", None), ("gpu-1-exclusive", None), ("gpu-1-whole", None),
    ("cpu-1", None), ("gpu--1", None), ("gpu-x-sm-sharing", None),
])
def test_device_names_read_back(name: str, parsed: DeviceName | None) -> None:
    assert parse_device_name(name) == parsed


# ---- reading a claim ----

def test_a_claim_reads_only_this_drivers_results_and_its_own_config_wins_over_its_class() -> None:
    obj = claim("gpu-0-time-slicing", configs=[limit_config("60Gi", source="FromClaim"),
                                               limit_config("50Gi", source="FromClass")])
    obj["status"]["allocation"]["devices"]["results"].append(
        {"request": "nic", "driver": "nic.example.com", "pool": NODE, "device": "eth0"})
    allocation = read_claim(obj)
    assert [d.device for d in allocation.devices] == ["gpu-0-time-slicing"]
    assert allocation.devices[0].consumed == {"memory": "40Gi"} and allocation.limit_mib == {"": 60 * 1024}


@pytest.mark.parametrize(("obj", "message"), [
    ({"metadata": {"namespace": "team", "name": "c", "uid": "u"}, "status": {}}, "is not allocated"),
    (claim("gpu-0", driver="other.example.com"), "has no device of driver gpu.gpufrac.io"),
    (claim("gpu-0", configs=[{"opaque": {"driver": "gpu.gpufrac.io", "parameters": {"kind": "Other"}}}]),
     "must be apiVersion gpu.gpufrac.io/v1alpha1, kind GpuConfig"),
    (claim("gpu-0", configs=[limit_config("48Gi", cores=30)]), "unknown fields ['cores']"),
    (claim("gpu-0", configs=[limit_config("lots")]), "'lots' is not a Kubernetes quantity"),
])
def test_a_claim_that_does_not_read_is_refused_in_one_line(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(ClaimError, match=message.replace("[", r"\[").replace("]", r"\]")) as err:
        prepared(obj)
    assert "\n" not in str(err.value)


# ---- Prepare ----

def test_a_time_slicing_claim_gets_the_toolkits_device_and_its_limits_in_mib() -> None:
    result = prepared(claim("gpu-0-time-slicing", configs=[limit_config("48Gi")]))
    [device] = result.devices
    assert (device.gpu_uuid, device.mode, device.request_mib, device.limit_mib) == (
        "GPU-00000000-aaaa", "time-slicing", 40 * 1024, 48 * 1024)
    assert device.cdi_ids == ("nvidia.com/gpu=GPU-00000000-aaaa", "gpu.gpufrac.io/claim=uid-1-gpu-0-time-slicing")
    spec = cdi_spec(result, node())
    assert spec is not None and spec["kind"] == "gpu.gpufrac.io/claim"
    assert spec["devices"][0]["name"] == "uid-1-gpu-0-time-slicing"
    assert "deviceNodes" not in spec["devices"][0]["containerEdits"]  # the toolkit's device brings them, and hooks
    assert env_of(spec) == {"NVIDIA_GPU_MEMORY_REQUEST": "40960", "NVIDIA_GPU_MEMORY_LIMIT": "49152",
                            "CUDA_MPS_PIPE_DIRECTORY": "/run/gpufrac/mps/time-slicing",
                            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "GPU-00000000-aaaa=49152M",
                            "GPUFRAC_DRA_CLAIM": "uid-1"}  # which claim: one pod per time-slicing claim
    assert spec_file_name("uid-1") == "gpu.gpufrac.io-claim_uid-1.json"


def test_an_sm_sharing_claim_gets_the_mps_directories_and_its_thread_percentage() -> None:
    spec = cdi_spec(prepared(claim("gpu-1-sm-sharing", memory="10Gi", compute="30")), node())
    assert env_of(spec) == {"NVIDIA_GPU_MEMORY_REQUEST": "10240", "NVIDIA_GPU_MEMORY_LIMIT": "10240",
                            "CUDA_MPS_PIPE_DIRECTORY": "/run/gpufrac/mps/sm-sharing",
                            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "GPU-10000000-aaaa=10240M",
                            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
                            "NVIDIA_VISIBLE_DEVICES": "GPU-10000000-aaaa"}
    assert spec is not None
    edits = spec["devices"][0]["containerEdits"]
    # GPU 1 has no toolkit device on this node: its device node and the control devices the host has.
    assert [d["path"] for d in edits["deviceNodes"]] == ["/dev/nvidia1", "/dev/nvidia-uvm", "/dev/nvidiactl"]
    assert [(m["hostPath"], m["containerPath"]) for m in edits["mounts"]] == [
        ("/run/gpufrac/mps/sm-sharing", "/run/gpufrac/mps/sm-sharing"), ("/run/gpufrac/mps/shm", "/dev/shm")]


def test_without_an_mps_daemon_time_slicing_keeps_the_driver_limits_and_sm_sharing_is_refused() -> None:
    driver_only = node(mps_modes=frozenset())
    spec = cdi_spec(prepared(claim("gpu-0-time-slicing"), driver_only), driver_only)
    assert env_of(spec) == {"NVIDIA_GPU_MEMORY_REQUEST": "40960", "NVIDIA_GPU_MEMORY_LIMIT": "40960",
                            "GPUFRAC_DRA_CLAIM": "uid-1"}
    with pytest.raises(ClaimError, match="runs no sm-sharing MPS daemon"):
        prepared(claim("gpu-0-sm-sharing"), driver_only)


def test_a_whole_gpu_the_toolkit_names_is_only_the_toolkits_device() -> None:
    result = prepared(claim("gpu-0", memory=None))
    assert result.devices[0].cdi_ids == ("nvidia.com/gpu=GPU-00000000-aaaa",)
    assert result.devices[0].request_mib == 81_000 and cdi_spec(result, node()) is None


def test_the_backstop_refuses_a_second_mode_or_a_share_that_does_not_fit_on_the_gpu() -> None:
    first = prepared(claim("gpu-0-time-slicing", uid="a"))
    second = prepared(claim("gpu-0-time-slicing", uid="b", memory="40000Mi"), others=(first,))
    assert second.devices[0].gpu_index == 0
    with pytest.raises(ClaimError, match=r"GPU 0 \(GPU-00000000-aaaa\) serves time-slicing to claim team/claim-a"):
        prepared(claim("gpu-0-sm-sharing", uid="c", memory="1Gi"), others=(first,))
    with pytest.raises(ClaimError, match="serves time-slicing"):
        prepared(claim("gpu-0", uid="d", memory=None), others=(first,))
    with pytest.raises(ClaimError, match="has 40 MiB left of 81000 MiB for prepared claims; this claim asks 1024"):
        prepared(claim("gpu-0-time-slicing", uid="e", memory="1Gi"), others=(first, second))
    assert prepared(claim("gpu-1-sm-sharing", uid="f"), others=(first, second)).devices[0].gpu_index == 1


def test_preparing_a_claim_again_does_not_conflict_with_its_own_record() -> None:
    first = prepared(claim("gpu-0-time-slicing", uid="a", memory="80000Mi"))
    assert prepared(claim("gpu-0-time-slicing", uid="a", memory="80000Mi"), others=(first,)) == first


@pytest.mark.parametrize(("obj", "message"), [
    (claim("gpu-0-time-slicing", pool="node-b"), "device node-b/gpu-0-time-slicing is not one this node publishes"),
    (claim("gpu-7-time-slicing"), "GPU 7 is not on node node-a"),
    (claim("gpu-0-time-slicing", configs=[limit_config("20Gi")]), "the memory limit 20480 MiB must lie between"),
    (claim("gpu-0-time-slicing", configs=[limit_config("90Gi")]), "and the GPU's usable 81000 MiB"),
    (claim("gpu-0-sm-sharing", compute="0"), "consumed compute '0' is not a percentage"),
])
def test_prepare_refuses_what_the_node_cannot_run(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(ClaimError, match=message):
        prepared(obj)


def test_a_share_with_a_second_device_in_one_claim_is_refused() -> None:
    obj = claim("gpu-0-time-slicing")
    obj["status"]["allocation"]["devices"]["results"].append(
        {"request": "more", "driver": "gpu.gpufrac.io", "pool": NODE, "device": "gpu-1"})
    with pytest.raises(ClaimError, match="has 2 devices and a share among them"):
        prepared(obj)


# ---- the state file ----

def test_the_state_file_gives_back_what_was_prepared() -> None:
    claims = [prepared(claim("gpu-0-time-slicing", uid="a", configs=[limit_config("48Gi")])),
              prepared(claim("gpu-1-sm-sharing", uid="b", compute="25"))]
    assert dra_state.load(dra_state.dump(claims)) == {"a": claims[0], "b": claims[1]}


@pytest.mark.parametrize(("text", "message"), [
    ("{", "do not read"), ('{"version": 9, "claims": []}', "state version 9"), ('{"version": 1}', "do not read"),
])
def test_a_state_file_that_does_not_read_says_so(text: str, message: str) -> None:
    with pytest.raises(dra_state.StateError, match=message):
        dra_state.load(text)


# ---- claims as fractions (the sm-sharing daemon holds them like annotated ones) ----

def test_prepared_shares_are_fractions_the_daemon_side_plans_with_and_whole_gpus_are_not() -> None:
    sm = prepared(claim("gpu-1-sm-sharing", uid="uid-sm", memory="10Gi", compute="30"))
    ts = prepared(claim("gpu-0-time-slicing", uid="uid-ts"))
    whole = prepared(claim("gpu-0", uid="uid-whole", memory=None))
    fractions = list(claim_tenants([sm, ts, whole]).tenants)
    assert [(f.namespace, f.pod, f.container, f.mode, f.fraction.limit_mib, f.fraction.devices,
             f.fraction.active_thread_percent) for f in fractions] == [
        ("team", "claim-uid-sm", "claim-uid-sm/gpu", ComputeMode.SM_SHARING, 10240, ("GPU-10000000-aaaa",), 30),
        ("team", "claim-uid-ts", "claim-uid-ts/gpu", ComputeMode.TIME_SLICING, 40960, ("GPU-00000000-aaaa",), None)]
    plan = mps_limits.plan(fractions, [g.gpu for g in gpus().values()])
    assert plan.default_commands() == ["set_default_device_pinned_mem_limit GPU-10000000-aaaa 10240M",
                                       "set_default_active_thread_percentage 30"]


def test_the_driver_refuses_a_claim_on_an_annotations_node_and_on_a_gpu_holding_an_annotated_fraction() -> None:
    annotations_node = node(front_door=FrontDoorChoice(FrontDoor.ANNOTATIONS,
                                                       "node label gpufrac.io/front-door=annotations"))
    with pytest.raises(ClaimError, match=r"^node node-a hands its GPUs out through annotations \(node label "
                                         r"gpufrac.io/front-door=annotations\), not through DRA"):
        prepared(claim("gpu-0-time-slicing"), annotations_node)
    busy = node(annotated={"GPU-00000000-aaaa": "container app of pod team-a/infer"})
    with pytest.raises(ClaimError, match=r"GPU 0 \(GPU-00000000-aaaa\) is served through annotations \(container "
                                         r"app of pod team-a/infer is placed on it\)"):
        prepared(claim("gpu-0-sm-sharing", compute="50"), busy)
    assert prepared(claim("gpu-1-sm-sharing", compute="50"), busy).devices[0].gpu_index == 1


# ---- claims held like annotated fractions: the audit, the usage series, reclaim ----

POD_UID = "0a1b2c3d-1111-2222-3333-444455556666"
OTHER_UID = "9f8e7d6c-1111-2222-3333-444455556666"


def cgroup_of(pod_uid: str, container: str = "c" * 64) -> str:
    """As the kubelet's systemd driver names a container's cgroup (the pod UID's dashes as underscores)."""
    return (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod_uid.replace('-', '_')}.slice/"
            f"cri-containerd-{container}.scope\n")


def test_a_claim_records_the_pods_it_is_reserved_for_and_the_env_its_device_gives() -> None:
    obj = claim("gpu-0-time-slicing", configs=[limit_config("48Gi")], pods=(("infer-0", POD_UID),),
                reserved=[{"apiGroup": "example.com", "resource": "pods", "name": "not-a-pod", "uid": OTHER_UID}])
    result = prepared(obj)
    assert result.pods == (ClaimPod("infer-0", POD_UID),)  # another group's "pods" are no pods
    [device] = result.devices
    assert {**dict(entry.split("=", 1) for entry in device.env), "GPUFRAC_DRA_CLAIM": "uid-1"} == env_of(
        cdi_spec(result, node()))
    assert dra_state.load(dra_state.dump([result])) == {"uid-1": result}
    # a record written before the pods and the env were kept reads, without them
    record = json.loads(dra_state.dump([result]))
    del record["claims"][0]["pods"], record["claims"][0]["devices"][0]["env"]
    old_record = dra_state.load(json.dumps(record))
    assert old_record["uid-1"].pods == () and old_record["uid-1"].devices[0].env == ()


def claim_snapshot(processes: list[GpuProcess], environs: dict[int, dict[str, str]], **claim_fields: Any) -> Snapshot:
    result = prepared(claim("gpu-0-time-slicing", pods=(("infer-0", POD_UID),), configs=[limit_config("48Gi")],
                            **claim_fields))
    infos = {g.gpu.uuid: g.gpu for g in gpus().values()}
    cgroups = {p.pid: cgroup_of(POD_UID if p.pid < 200 else OTHER_UID) for p in processes}
    return Snapshot(processes, {}, cgroups, environs, infos, claim_tenants([result]))


GPU_0, GPU_1 = "GPU-00000000-aaaa", "GPU-10000000-aaaa"


def test_a_claims_processes_are_those_of_its_pod_on_its_gpu_and_are_held_to_its_limit() -> None:
    mib = 1 << 20
    processes = [GpuProcess(GPU_0, 101, 30000 * mib, 40), GpuProcess(GPU_0, 102, 25000 * mib, 10),
                 GpuProcess(GPU_1, 103, 1000 * mib, 5),  # its pod, another GPU: not the claim's share
                 GpuProcess(GPU_0, 201, 9000 * mib, 5)]  # another pod on its GPU
    [tenant] = claim_snapshot(processes, {}).claims.tenants
    env = dict(entry.split("=", 1) for entry in tenant.written_env or ())
    findings = decide(claim_snapshot(processes, {101: env, 102: {**env, "NVIDIA_VISIBLE_DEVICES": "void"}}))
    assert [(a.process.pid, a.container.pod, a.container.container) for a in findings.attributed] == [
        (101, "infer-0", "claim-uid-1/gpu"), (102, "infer-0", "claim-uid-1/gpu")]
    [over] = findings.violations
    assert over.kind is ViolationKind.MEMORY_OVER_LIMIT and over.container.pod_uid == POD_UID
    assert "uses 55000 MiB of GPU memory on GPU-00000000-aaaa, over its limit of 49152 MiB" in over.message
    [sample] = findings.usage
    assert (sample.namespace, sample.pod, sample.container, sample.gpu_uuid, sample.used_bytes,
            sample.limit_bytes) == ("team", "infer-0", "claim-uid-1/gpu", GPU_0, 55000 * mib, 49152 * mib)
    assert "fieldPath" not in event_body(over, NODE, dt.datetime.now(dt.UTC))["involvedObject"]


def test_a_claims_process_without_its_env_or_with_another_limit_is_a_violation() -> None:
    processes = [GpuProcess(GPU_0, 101, 1 << 30, 5), GpuProcess(GPU_0, 102, 1 << 30, 5)]
    [tenant] = claim_snapshot(processes, {}).claims.tenants
    env = dict(entry.split("=", 1) for entry in tenant.written_env or ())
    findings = decide(claim_snapshot(processes, {
        101: {k: v for k, v in env.items() if k != "NVIDIA_GPU_MEMORY_LIMIT"},
        102: {**env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{GPU_0}=81000M"}}))
    by_kind = {v.kind: v.message for v in findings.violations}
    assert set(by_kind) == {ViolationKind.MISSING_LIMIT_ENV, ViolationKind.LIMIT_ENV_MISMATCH}
    assert "without NVIDIA_GPU_MEMORY_LIMIT" in by_kind[ViolationKind.MISSING_LIMIT_ENV]
    assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={GPU_0}=81000M" in by_kind[ViolationKind.LIMIT_ENV_MISMATCH]


def test_a_claim_is_owed_its_request_from_prepare_on() -> None:
    snapshot = claim_snapshot([GpuProcess(GPU_0, 201, 60000 << 20, 5)], {})
    memory = {GPU_0: GpuMemory(GPU_0, 80 * GIB, 0, 60000 << 20, 80 * GIB - (60000 << 20))}
    # process 201 is known to be no tenant's (its cgroup read, naming no claim's pod): its use is not the claim's
    [share] = reclaim.shares([], snapshot.claims.tenants, snapshot.gpus, memory, {GPU_0: 60000 << 20})
    [tenant] = share.tenants
    assert (tenant.container.pod, tenant.request_bytes, tenant.owed_bytes) == ("infer-0", 40 * GIB, 40 * GIB)
    assert share.shortfall_bytes == 40 * GIB - share.free_bytes > 0


# ---- admin access, what the node cannot enforce, GPUs held elsewhere or lost ----

def admin_claim(device: str, uid: str) -> dict[str, Any]:
    obj = claim(device, uid=uid, memory=None)
    obj["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    return obj


def test_an_admin_access_claim_owes_nothing_and_is_no_tenant() -> None:
    full = prepared(claim("gpu-0-time-slicing", uid="full", memory="81000Mi"))
    admin = prepared(admin_claim("gpu-0-time-slicing", "admin"), others=(full,))  # the GPU has no MiB left
    [device] = admin.devices
    assert (device.admin, device.request_mib, device.limit_mib) == (True, 0, 0)
    assert claim_tenants([admin]).tenants == ()
    assert cdi_spec(admin, node()) is None and device.cdi_ids == ("nvidia.com/gpu=GPU-00000000-aaaa",)  # no limits
    # and it takes nothing from a share prepared after it
    assert prepared(claim("gpu-1-time-slicing", uid="next", memory="81000Mi"), others=(admin,)).devices
    again = prepared(claim("gpu-0-time-slicing", uid="late", memory="1Mi"), others=(admin,))
    assert again.devices[0].request_mib == 1
    assert dra_state.load(dra_state.dump([admin]))["admin"] == admin


def test_a_mode_the_node_cannot_enforce_is_neither_published_nor_prepared() -> None:
    weak = node(unenforced={"time-slicing": "its memory limits are not enforced"})
    _, devices = resource_slices(NODE, weak.publishable(), "615.10", generation=1, offered=weak.offered())
    assert sorted(d["name"] for d in devices["spec"]["devices"]) == [
        "gpu-0", "gpu-0-sm-sharing", "gpu-1", "gpu-1-sm-sharing"]
    with pytest.raises(ClaimError, match=r"cannot hold a time-slicing claim's limits now \(its memory limits are not "
                                         r"enforced\); it publishes no such device"):
        prepared(claim("gpu-0-time-slicing"), weak)
    assert prepared(claim("gpu-0-sm-sharing", compute="20"), weak).devices[0].mode == "sm-sharing"


def test_a_gpu_of_nvidias_device_plugin_is_not_published_nor_prepared() -> None:
    shared = node(plugin_gpus={GPU_0: "allocated whole by the kubelet, its device checkpoint says"})
    assert [g.gpu.uuid for g in shared.publishable()] == [GPU_1]
    with pytest.raises(ClaimError, match=r"GPU 0 \(GPU-00000000-aaaa\) is NVIDIA's device plugin's"):
        prepared(claim("gpu-0"), shared)


def test_the_gpus_the_kubelet_gave_out_through_a_device_plugin_are_read_from_its_checkpoint() -> None:
    text = json.dumps({"Data": {"PodDeviceEntries": [
        {"PodUID": "p1", "ContainerName": "a", "ResourceName": "nvidia.com/gpu", "DeviceIDs": {"-1": [GPU_0]}},
        {"PodUID": "p2", "ContainerName": "b", "ResourceName": "nvidia.com/gpu.shared", "DeviceIDs": {"0": ["1::3"]}},
        {"PodUID": "p3", "ContainerName": "c", "ResourceName": "example.com/nic", "DeviceIDs": {"0": ["eth0"]}}],
        "RegisteredDevices": {"nvidia.com/gpu": [GPU_0, GPU_1]}}, "Checksum": 1})
    assert parse_checkpoint(text).allocated() == {GPU_0, "1"}  # a replica is its GPU; an index stays an index
    assert parse_checkpoint(json.dumps({"Data": {"PodDeviceEntries": None}})).allocated() == frozenset()


def test_a_lost_gpus_devices_are_tainted_and_refused_and_untainted_when_it_returns() -> None:
    sick = node(lost={GPU_0: "XID 79"})
    lost = {g.gpu.index: sick.lost[g.gpu.uuid] for g in sick.publishable() if g.gpu.uuid in sick.lost}
    _, devices = resource_slices(NODE, sick.publishable(), "615.10", generation=1, lost=lost)
    taints = {d["name"]: d.get("taints") for d in devices["spec"]["devices"]}
    assert taints["gpu-0-time-slicing"] == taints["gpu-0"] == [
        {"key": "gpu.gpufrac.io/unhealthy", "value": "XID 79", "effect": "NoSchedule"}]
    assert taints["gpu-1"] is None
    with pytest.raises(ClaimError, match=r"GPU 0 \(GPU-00000000-aaaa\) is unhealthy \(XID 79\)"):
        prepared(claim("gpu-0-time-slicing"), sick)
    _, healed = resource_slices(NODE, node().publishable(), "615.10", generation=2)
    assert not any("taints" in d for d in healed["spec"]["devices"])


def test_the_slices_are_owned_by_their_node() -> None:
    for body in resource_slices(NODE, gpus().values(), "615.10", generation=1, node_uid="node-uid-1"):
        assert body["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid-1", "controller": True}]


@pytest.mark.parametrize(("device", "consumed", "message"), [
    ("gpu-0-time-slicing", {"memory": "1Gi", "compute": "50"}, r"names \['compute'\], which a time-slicing device "
                                                               r"does not publish"),
    ("gpu-0-sm-sharing", {"memory": "1Gi", "cores": "2"}, r"names \['cores'\]"),
])
def test_consumed_capacity_is_read_for_every_capacity_and_one_not_published_is_refused(
        device: str, consumed: dict[str, str], message: str) -> None:
    obj = claim(device)
    obj["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = consumed
    with pytest.raises(ClaimError, match=message):
        prepared(obj)


def test_a_node_whose_runtime_does_not_read_the_dra_cdi_directory_says_so_and_refuses_claims() -> None:
    problem = cdi_dir_problem("/var/run/cdi", ["/var/lib/gpufrac-node/containerd/cdi"])
    assert problem is not None and "writes claims' CDI specs to /var/run/cdi, which the container runtime does not " \
        "read (its CDI spec directories: /var/lib/gpufrac-node/containerd/cdi)" in problem
    assert cdi_dir_problem("/var/run/cdi/", ["/etc/cdi", "/var/run/cdi"]) is None
    with pytest.raises(ClaimError, match="which the container runtime does not read"):
        prepared(claim("gpu-0-time-slicing"), node(cdi_problem=problem))


# ---- the records held against the API ----

def test_a_record_whose_claim_is_gone_is_dropped_and_a_shared_claim_takes_every_pod_reserved() -> None:
    record = prepared(claim("gpu-0-time-slicing", pods=(("infer-0", POD_UID),)))
    assert reconciled(record, None) is None
    assert reconciled(record, claim("gpu-0-time-slicing", uid="another-uid")) is None
    assert reconciled(record, claim("gpu-0-time-slicing", pods=(("infer-0", POD_UID),))) is record
    later = reconciled(record, claim("gpu-0-time-slicing", pods=(("infer-0", POD_UID), ("infer-1", OTHER_UID))))
    assert later is not None and {p.uid for p in later.pods} == {POD_UID, OTHER_UID}
    # the audit now takes the second pod's processes on the GPU as the claim's
    tenants = claim_tenants([later])
    assert (OTHER_UID, GPU_0) in tenants.by_pod_gpu and (OTHER_UID, GPU_0) not in claim_tenants([record]).by_pod_gpu
    snapshot = Snapshot([GpuProcess(GPU_0, 201, 1 << 30, 5)], {}, {201: cgroup_of(OTHER_UID)}, {},
                        {g.gpu.uuid: g.gpu for g in gpus().values()}, tenants)
    assert [a.container.container for a in decide(snapshot).attributed] == ["claim-uid-1/gpu"]
    # no pod reserved any more (the kubelet unprepares it soon): its last pods stay
    assert reconciled(record, claim("gpu-0-time-slicing")) is record


TS_UID = "7c9e6679-7425-40de-944b-e07fc1f90ae7"  # a claim's UID is a UUID


def test_a_time_slicing_claim_serves_one_pod_and_a_second_pods_container_is_refused() -> None:
    record = prepared(claim("gpu-0-time-slicing", uid=TS_UID, pods=(("infer-0", POD_UID),)))
    shared = reconciled(record, claim("gpu-0-time-slicing", uid=TS_UID,
                                      pods=(("infer-0", POD_UID), ("a-later-pod", OTHER_UID))))
    assert shared is not None and shared.pods[0].uid == POD_UID  # the first stays first, whatever the names
    holders = time_slicing_holders([shared])
    assert holders == {TS_UID: ClaimHolder(f"team/claim-{TS_UID}", POD_UID, "infer-0", (GPU_0,))}
    env = env_of(cdi_spec(shared, node()))
    facts = NodeFacts(claim_holders=holders)

    def create(pod_uid: str, **seen: Any) -> Any:
        pod = PodInfo("team", "p", pod_uid, {})
        return nri_decide(pod, ContainerInfo("c" * 64, "app", seen.get("env", {}), cdi_devices=seen.get("cdi", ()),
                                             uid=seen.get("uid")), seen.get("facts", facts))

    refused = create(OTHER_UID, env=env)
    assert isinstance(refused, Refusal) and refused.reason is RefusalReason.CLAIM_SHARED
    assert f"uses time-slicing claim team/claim-{TS_UID}, which serves pod infer-0" in refused.message
    assert "ResourceClaimTemplate" in refused.message
    by_cdi = create(OTHER_UID, cdi=(f"gpu.gpufrac.io/claim={TS_UID}-gpu-0-time-slicing",))
    assert isinstance(by_cdi, Refusal) and by_cdi.reason is RefusalReason.CLAIM_SHARED
    runs = create(POD_UID, env=env, uid=1000)  # its own pod runs, a client of the time-slicing daemon
    assert not isinstance(runs, Refusal) and runs.serving is not None
    assert (runs.serving.mode, runs.serving.gpus, runs.serving.uid) == (ComputeMode.TIME_SLICING, (GPU_0,), 1000)
    # where the time-slicing daemon serves one user at a time (no -m), another UID is refused, as annotated ones are
    serving_root = NodeFacts(claim_holders=holders, serving=(replace(runs.serving, container_id="d" * 64, uid=0),))
    other_user = create(POD_UID, env=env, uid=1000, facts=serving_root)
    assert isinstance(other_user, Refusal) and other_user.reason is RefusalReason.MPS_USER_CONFLICT
    assert "runs as UID 1000, but this node's time-slicing MPS daemon serves one user at a time and serves UID 0" \
        in other_user.message
    multi = replace(serving_root, multi_user_modes=frozenset({ComputeMode.TIME_SLICING}))
    assert not isinstance(create(POD_UID, env=env, uid=1000, facts=multi), Refusal)
    # the holder gone from reservedFor: the next pod holds it
    after = reconciled(shared, claim("gpu-0-time-slicing", uid=TS_UID, pods=(("a-later-pod", OTHER_UID),)))
    assert after is not None and time_slicing_holders([after])[TS_UID].pod_uid == OTHER_UID
    # sm-sharing claims and admin access are not judged here
    sm = prepared(claim("gpu-1-sm-sharing", uid="sm", pods=(("infer-0", POD_UID),)))
    assert time_slicing_holders([sm]) == {}


def test_an_sm_sharing_claim_sees_its_own_mps_namespace_only() -> None:
    v3 = node(mps_namespaces=True)
    result = prepared(claim("gpu-1-sm-sharing", compute="30", configs=[limit_config("48Gi")]), v3)
    [spec_device] = (spec := cdi_spec(result, v3) or {})["devices"]
    own = f"/run/gpufrac/mps/sm-sharing/gpufrac/{claim_namespace_name('team', 'claim-uid-1/gpu')}"
    assert [(m["hostPath"], m["containerPath"]) for m in spec_device["containerEdits"]["mounts"]] == [
        (own, "/run/gpufrac/mps/sm-sharing"), ("/run/gpufrac/mps/shm", "/dev/shm")]  # not the daemon's directory
    assert env_of(spec)["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gpufrac/mps/sm-sharing"
    # the daemon side creates that namespace with the claim's limits, whichever pods use the claim
    [tenant] = claim_tenants([result]).tenants
    assert wanted([tenant]) == {claim_namespace_name("team", "claim-uid-1/gpu"): Namespace(
        claim_namespace_name("team", "claim-uid-1/gpu"), 48 * 1024, 30, "team/claim-uid-1/claim-uid-1/gpu")}
    # without namespaces (a pre-r615 driver), the daemon's directory, as before
    plain = cdi_spec(result, node())
    assert plain is not None and plain["devices"][0]["containerEdits"]["mounts"][0]["hostPath"] == \
        "/run/gpufrac/mps/sm-sharing"


def test_publishing_notices_an_api_server_that_drops_the_sharing_fields() -> None:
    wanted = resource_slices(NODE, gpus().values(), "615.10", generation=1, lost={0: "XID 79"})
    assert dropped_fields(wanted, json.loads(json.dumps(wanted))) is None
    stored = json.loads(json.dumps(wanted))  # as a server without 1.36's DRA gates keeps them
    del stored[0]["spec"]["sharedCounters"]
    for device in stored[1]["spec"]["devices"]:
        device.pop("allowMultipleAllocations", None)
        device.pop("taints", None)
        device["capacity"] = {k: {"value": v["value"]} for k, v in device["capacity"].items()}
    problem = dropped_fields(wanted, stored)
    assert problem is not None and problem.startswith(
        "the API server dropped allowMultipleAllocations, capacity.requestPolicy, sharedCounters, taints from the "
        "ResourceSlices") and "needs Kubernetes 1.36+" in problem
