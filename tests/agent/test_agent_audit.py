"""Mapping GPU processes to containers through /proc, and auditing them against their pods' annotations."""

from __future__ import annotations

import pytest

from gpufrac.agent.decide.attribution import AttributedProcess, attribute
from gpufrac.agent.decide.audit import Snapshot, audit, decide, device_assigned, usage
from gpufrac.agent.decide.errors import ProcReadError
from gpufrac.agent.decide.model import GpuProcess, ViolationKind
from gpufrac.agent.decide.pods import fractional_containers, index_by_container_id
from gpufrac.agent.decide.proc_text import container_ids_in_cgroup, normalize_container_id, pod_uids_in_cgroup
from gpufrac.agent.edges.procfs import read_cgroup, read_environ, read_memory_limit
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import MIB
from testkit.agent import (
    UUID_A,
    UUID_B,
    canonical_annotations,
    cid,
    container,
    gpu_info,
    injected_env,
    pod,
)
from testkit.fakes.state import CGROUP_FORMS, ProcRoot

GPUS = {UUID_A: gpu_info(0, UUID_A), UUID_B: gpu_info(1, UUID_B)}


def proc(pid: int, used_mib: int = 1024, gpu: str = UUID_A, sm: int | None = 10) -> GpuProcess:
    return GpuProcess(gpu, pid, used_mib * MIB, sm)


def kinds(violations) -> list[str]:
    return sorted(str(v.kind) for v in violations)


# ---- /proc and cgroups ----

@pytest.mark.parametrize("form", sorted(CGROUP_FORMS))
def test_container_id_in_every_cgroup_form(form):
    text = CGROUP_FORMS[form].format(uid="0a1b2c3d_0000", id=cid(7))
    assert container_ids_in_cgroup(text) == {cid(7)}


POD_UID = "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"


@pytest.mark.parametrize("form", sorted(CGROUP_FORMS))
@pytest.mark.parametrize("separator", ["-", "_"])  # cgroupfs keeps the UID's dashes, systemd makes them _
def test_pod_uid_in_every_cgroup_form(form, separator):
    text = CGROUP_FORMS[form].format(uid=POD_UID.replace("-", separator), id=cid(7))
    assert pod_uids_in_cgroup(text) == {POD_UID}
    assert pod_uids_in_cgroup("0::/system.slice/containerd.service\n") == set()
    assert pod_uids_in_cgroup("0::/kubepods/podnot-a-uid/" + cid(7) + "\n") == set()


def test_cgroup_without_a_container():
    assert container_ids_in_cgroup("0::/system.slice/containerd.service\n") == set()
    assert container_ids_in_cgroup("0::/kubepods.slice/crio-conmon-" + cid(3) + ".scope\n") == set()
    assert container_ids_in_cgroup("garbage") == set()


@pytest.mark.parametrize("status_id", [f"containerd://{cid(5)}", f"cri-o://{cid(5)}", f"docker://{cid(5)}"])
def test_status_container_ids_lose_their_scheme(status_id):
    assert normalize_container_id(status_id) == cid(5)


def test_proc_root_reads(tmp_path):
    root = ProcRoot(tmp_path / "proc")
    root.add(42, cid(1), {"A": "1", "B": "x=y"}, form="v1-cgroupfs")
    assert container_ids_in_cgroup(read_cgroup(root.root, 42)) == {cid(1)}
    assert read_environ(root.root, 42) == {"A": "1", "B": "x=y"}
    with pytest.raises(ProcReadError, match="43"):
        read_cgroup(root.root, 43)


def test_memory_limit_file(tmp_path):
    f = tmp_path / "memory.max"
    f.write_text("1073741824\n")
    assert read_memory_limit(f) == 1 << 30
    f.write_text("max\n")
    assert read_memory_limit(f) is None
    assert read_memory_limit(tmp_path / "absent") is None


# ---- pods ----

def test_fractional_containers_from_pod():
    ann = canonical_annotations("app", request_mib=2048, limit_mib=4096, devices=[UUID_A], mode="sm-sharing")
    p = pod("train", uid="u1", containers={"app": cid(1), "sidecar": cid(2)}, annotations=ann, runtime="cri-o")
    [c] = fractional_containers(p)
    assert (c.namespace, c.pod, c.pod_uid, c.container, c.container_id) == ("team-a", "train", "u1", "app", cid(1))
    assert (c.mode, c.fraction.request_mib, c.fraction.limit_mib, c.fraction.devices) == (
        ComputeMode.SM_SHARING, 2048, 4096, (UUID_A,))
    assert fractional_containers(pod("w", uid="u2", containers={"app": cid(3)}, annotations=ann,
                                     running=False)) == []
    assert fractional_containers(pod("n", uid="u3", containers={"app": cid(4)}, annotations={})) == []


def test_attribution_through_proc_root(tmp_path):
    root = ProcRoot(tmp_path / "proc")
    ann = canonical_annotations("app", request_mib=2048, limit_mib=4096, devices=[UUID_A])
    containers = index_by_container_id([pod("p", uid="u1", containers={"app": cid(1)}, annotations=ann)]).by_id
    root.add(100, cid(1), {}, form="v2-crio-systemd")
    root.add(101, cid(9), {})  # some other container: not fractional
    cgroups = {pid: read_cgroup(root.root, pid) for pid in (100, 101)}
    matched = attribute([proc(100), proc(101), proc(102)], containers, cgroups, {})
    assert [(m.process.pid, m.container.pod) for m in matched] == [(100, "p")]


# ---- audit ----

def attributed(c, pid=100, used_mib=1024, gpu=UUID_A, env=None, sm=10):
    return AttributedProcess(proc(pid, used_mib, gpu, sm), c, injected_env(c) if env is None else env)


def test_a_process_with_its_limits_and_within_them_is_fine():
    c = container()
    assert audit([attributed(c), attributed(c, pid=101, used_mib=3072)], GPUS) == []


@pytest.mark.parametrize("dropped", ["NVIDIA_GPU_MEMORY_LIMIT", "NVIDIA_GPU_MEMORY_REQUEST",
                                     "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_PIPE_DIRECTORY",
                                     "NVIDIA_VISIBLE_DEVICES"])
def test_each_missing_injected_variable_is_a_violation(dropped):
    c = container()
    env = injected_env(c)
    del env[dropped]
    [v] = audit([attributed(c, env=env)], GPUS)
    assert v.kind is ViolationKind.MISSING_LIMIT_ENV
    assert v.kind.event_reason == "GPULimitEnvMissing"
    assert dropped in v.message and "100" in v.message


@pytest.mark.parametrize(("name", "value"), [
    ("NVIDIA_GPU_MEMORY_LIMIT", "999999"),
    ("NVIDIA_GPU_MEMORY_REQUEST", "1"),
    ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=999999M"),
    ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "not-a-limit"),
    ("CUDA_MPS_PIPE_DIRECTORY", "/run/gpufrac/mps/sm-sharing"),
    ("NVIDIA_VISIBLE_DEVICES", UUID_B),
])
def test_a_wrong_value_is_a_mismatch(name, value):
    c = container()
    env = injected_env(c) | {name: value}
    [v] = audit([attributed(c, env=env)], GPUS)
    assert v.kind is ViolationKind.LIMIT_ENV_MISMATCH
    assert f"{name}={value}" in v.message


def test_void_visible_devices_of_a_cdi_injected_container_is_fine():
    # NVIDIA's CDI specs set NVIDIA_VISIBLE_DEVICES=void in the containers they give GPUs to (the NRI plugin's way)
    c = container()
    assert audit([attributed(c, env=injected_env(c) | {"NVIDIA_VISIBLE_DEVICES": "void"})], GPUS) == []


def test_unreadable_environ_is_not_a_violation():
    c = container()
    assert audit([AttributedProcess(proc(100), c, None)], GPUS) == []


def test_over_limit_counts_all_the_containers_processes_on_the_gpu():
    c = container(limit_mib=4096)
    violations = audit([attributed(c, 100, 3000), attributed(c, 101, 1100)], GPUS)
    [v] = violations
    assert v.kind is ViolationKind.MEMORY_OVER_LIMIT and v.kind.event_reason == "GPUMemoryLimitExceeded"
    assert v.pids == (100, 101)
    assert "uses 4100 MiB" in v.message and "limit of 4096 MiB" in v.message
    # exactly at the limit is fine
    assert audit([attributed(c, 100, 4096)], GPUS) == []


def test_process_on_an_unassigned_gpu():
    c = container(devices=(UUID_A,))
    [v] = audit([attributed(c, gpu=UUID_B)], GPUS)
    assert v.kind is ViolationKind.WRONG_DEVICE
    assert "GPU 1" in v.message and UUID_B in v.message


@pytest.mark.parametrize(("devices", "expected"), [
    ((UUID_A,), True), ((UUID_B,), False), (("0",), True), (("1",), False),
    ((f"k8s.device-plugin.nvidia.com/gpu={UUID_A}",), True), (("MIG-abcdef01-aaaa",), None),
])
def test_device_forms(devices, expected):
    assert device_assigned(devices, GPUS[UUID_A]) is expected


def test_mixed_modes_on_one_gpu_flag_every_container_there():
    ts = container("a", pod="ts", uid="u1", container_id=cid(1))
    sm = container("b", pod="sm", uid="u2", container_id=cid(2), mode=ComputeMode.SM_SHARING)
    other = container("c", pod="other", uid="u3", container_id=cid(3), devices=(UUID_B,))
    violations = audit([attributed(ts), attributed(sm, pid=200), attributed(other, pid=300, gpu=UUID_B)], GPUS)
    mixed = [v for v in violations if v.kind is ViolationKind.MIXED_MODES]
    assert sorted(v.container.pod for v in mixed) == ["sm", "ts"]
    assert all(v.gpu_uuid == UUID_A for v in mixed)
    assert "team-a/ts/a (time-slicing)" in mixed[0].message and "team-a/sm/b (sm-sharing)" in mixed[0].message
    assert kinds(violations) == ["mixed-modes", "mixed-modes"]


def test_usage_per_container_and_gpu_with_idle_series():
    busy = container("a", pod="busy", uid="u1", container_id=cid(1), request_mib=143771 // 4, limit_mib=40000)
    idle = container("b", pod="idle", uid="u2", container_id=cid(2), devices=(UUID_B,))
    samples = usage([attributed(busy, 100, 1000, sm=10), attributed(busy, 101, 24, sm=5)], [busy, idle], GPUS)
    by_pod = {s.pod: s for s in samples}
    assert by_pod["busy"].used_bytes == 1024 * MIB
    assert by_pod["busy"].limit_bytes == 40000 * MIB
    assert by_pod["busy"].sm_util == 15
    assert by_pod["busy"].sm_util_normalized == pytest.approx(15 / (35942 / 143771))
    assert (by_pod["idle"].gpu_uuid, by_pod["idle"].used_bytes, by_pod["idle"].sm_util) == (UUID_B, 0, 0)


def test_normalized_utilization_is_capped():
    small = container(request_mib=1024, limit_mib=1024)
    [s] = usage([attributed(small, used_mib=10, sm=90)], [small], GPUS)
    assert s.sm_util == 90 and s.sm_util_normalized == 100


def test_a_container_whose_canonical_values_do_not_parse_is_counted_not_dropped_silently():
    good = canonical_annotations("app", request_mib=2048, limit_mib=4096, devices=[UUID_A])
    broken = {**good, "gpufrac.io/container.app.gpu-memory.limit-mib": "4Gi"}
    index = index_by_container_id([pod("p", uid="u1", containers={"app": cid(1)}, annotations=good),
                                   pod("q", uid="u2", containers={"app": cid(2)}, annotations=broken)])
    assert set(index.by_id) == {cid(1)}
    assert index.unreadable == 1


def test_decide_is_one_pure_step_from_a_snapshot_to_violations_and_usage():
    ok, over = container("ok", uid="u1", container_id=cid(1)), container("over", uid="u2", container_id=cid(2))
    def cgroup(container_id: str) -> str:
        return CGROUP_FORMS["v2-containerd-systemd"].format(uid="u", id=container_id)

    snapshot = Snapshot(
        processes=[proc(100, used_mib=1024), proc(200, used_mib=5000), proc(300, used_mib=1)],
        containers={ok.container_id: ok, over.container_id: over},
        cgroups={100: cgroup(cid(1)), 200: cgroup(cid(2)), 300: cgroup(cid(9))},
        environs={100: injected_env(ok), 200: injected_env(over)},
        gpus=GPUS,
    )
    findings = decide(snapshot)
    assert [(str(v.kind), v.container.container) for v in findings.violations] == [("memory-over-limit", "over")]
    assert {(s.container, s.used_bytes) for s in findings.usage} == {("ok", 1024 * MIB), ("over", 5000 * MIB)}
    assert decide(snapshot) == findings


# ---- issue 25: the compute portion and CDI device names ----

CDI_A = f"k8s.device-plugin.nvidia.com/gpu={UUID_A}"


def sm_sharing(percent: int = 50, **kw):
    return container(mode=ComputeMode.SM_SHARING, active_thread_percent=percent, **kw)


def test_an_sm_sharing_process_carries_its_active_thread_percentage():
    c = sm_sharing(50)
    assert injected_env(c)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert audit([attributed(c)], GPUS) == []


def test_a_missing_active_thread_percentage_is_a_violation_like_a_missing_memory_limit():
    c = sm_sharing(50)
    env = injected_env(c)
    del env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]
    [v] = audit([attributed(c, env=env)], GPUS)
    assert v.kind is ViolationKind.MISSING_LIMIT_ENV and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in v.message


@pytest.mark.parametrize("value", ["100", "51", "0", "fifty"])
def test_an_active_thread_percentage_other_than_the_binds_is_a_mismatch(value):
    c = sm_sharing(50)
    [v] = audit([attributed(c, env=injected_env(c) | {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": value})], GPUS)
    assert v.kind is ViolationKind.LIMIT_ENV_MISMATCH
    assert f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={value} (expected 50)" in v.message


def test_a_time_slicing_container_is_not_held_to_a_percentage():
    c = container()
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in injected_env(c)
    assert audit([attributed(c, env=injected_env(c) | {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "7"})], GPUS) == []


def test_the_agent_reads_the_percentage_from_the_canonical_annotations(tmp_path):
    """Through the real path: the pod's annotations (the contract's writer), read_canonical, the audit."""
    from gpufrac.core.contract import CanonicalFraction, write_canonical

    annotations = write_canonical([CanonicalFraction("app", ComputeMode.SM_SHARING, 2048, 4096, {0: 4096},
                                                     (UUID_A,), 25)])
    assert annotations["gpufrac.io/container.app.active-thread-percent"] == "25"
    [running] = fractional_containers(pod("p1", uid="u1", containers={"app": cid(1)}, annotations=annotations))
    assert running.fraction.active_thread_percent == 25
    env = injected_env(running) | {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
    [v] = audit([attributed(running, env=env)], GPUS)
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 (expected 25)" in v.message


@pytest.mark.parametrize("devices", [(CDI_A,), ("nvidia.com/gpu=0",), (f"nvidia.com/gpu={UUID_A}",)])
def test_cdi_device_names_map_to_their_gpu_in_the_audit_and_the_metrics(devices):
    c = container(devices=devices)
    assert audit([attributed(c)], GPUS) == []
    [v] = audit([attributed(c, gpu=UUID_B)], GPUS)
    assert v.kind is ViolationKind.WRONG_DEVICE
    [sample] = usage([], [c], GPUS)  # the idle series of its GPU, found through the CDI name
    assert sample.gpu_uuid == UUID_A


def test_visible_devices_named_by_uuid_match_a_cdi_name_of_the_same_gpu():
    c = container(devices=(CDI_A,))
    assert audit([attributed(c, env=injected_env(c) | {"NVIDIA_VISIBLE_DEVICES": UUID_A})], GPUS) == []
    [v] = audit([attributed(c, env=injected_env(c) | {"NVIDIA_VISIBLE_DEVICES": UUID_B})], GPUS)
    assert v.kind is ViolationKind.LIMIT_ENV_MISMATCH
