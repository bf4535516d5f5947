"""Issue 30 at container creation: the pinned limit keyed by GPU UUID, and escape rows 4 and 8 refused by the NRI
plugin's decision (gpufrac.agent.nri.decide.creation with creation_escapes and pinned_env)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpufrac.agent.decide.audit import env_mismatches
from gpufrac.agent.nri.decide.creation import (
    ContainerInfo,
    DeviceNode,
    Injection,
    NodeFacts,
    Outcome,
    PodInfo,
    Refusal,
    RefusalReason,
    decide,
)
from gpufrac.agent.nri.wire import container_info
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import (
    DEFAULT_MPS_ROOT,
    format_pinned_mem_limit_by_uuid,
    mps_pipe_dir,
    parse_pinned_mem_limit_keys,
    pinned_limit_agrees,
    write_canonical,
)
from testkit.agent import UUID_A, UUID_B, container, gpu_info, injected_env
from testkit.nri_runtime import nri_container, pod_sandbox

PINNED = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
GPUS = (gpu_info(0, UUID_A), gpu_info(1, UUID_B))
CDI = frozenset({f"k8s.device-plugin.nvidia.com/gpu={UUID_A}", f"k8s.device-plugin.nvidia.com/gpu={UUID_B}",
                 "nvidia.com/gpu=1"})
NODE = NodeFacts(GPUS, CDI, {}, dict.fromkeys(ComputeMode))
SM_PIPE = mps_pipe_dir(DEFAULT_MPS_ROOT, ComputeMode.SM_SHARING)
RUNTIME_MOUNTS = ("/proc", "/dev", "/etc/hosts", "/dev/termination-log")


def entries(env: dict[str, str], *extra: str) -> tuple[str, ...]:
    """The env as the runtime holds it: the image's ENV first (extra), then the pod's."""
    return (*extra, *(f"{k}={v}" for k, v in env.items()))


def fraction(devices: str = UUID_B, mode: ComputeMode = ComputeMode.TIME_SLICING, *,
             mounts: tuple[str, ...] = (), image_env: tuple[str, ...] = ()) -> tuple[PodInfo, ContainerInfo]:
    listed = devices.split(",")
    threads = 100 if mode is ComputeMode.SM_SHARING else None  # the webhook writes 100 until a bind says less
    running = container("app", mode=mode, devices=tuple(listed), active_thread_percent=threads)
    annotations = write_canonical([running.fraction])
    env = injected_env(running)
    return (PodInfo("team-a", "infer", "u1", annotations),
            ContainerInfo("c1", "app", env, mounts=mounts, env_entries=entries(env, *image_env)))


def plain(env: dict[str, str], *image_env: str) -> tuple[PodInfo, ContainerInfo]:
    last_wins = dict(e.partition("=")[::2] for e in entries(env, *image_env))
    return PodInfo("team-a", "web", "u9", {}), ContainerInfo("c9", "web", last_wins,
                                                           env_entries=entries(env, *image_env))


# ---- 1. the client env keyed by GPU UUID ----

def test_the_uuid_keyed_value_round_trips_and_a_mix_is_refused() -> None:
    text = format_pinned_mem_limit_by_uuid(4096, [UUID_A, UUID_B])
    assert text == f"{UUID_A}=4096M,{UUID_B}=4096M"
    assert parse_pinned_mem_limit_keys(text) == {UUID_A: 4096, UUID_B: 4096}
    assert parse_pinned_mem_limit_keys("0=4096M,1=4096M") == {"0": 4096, "1": 4096}
    with pytest.raises(ValueError, match="by index or by UUID, not both"):
        parse_pinned_mem_limit_keys(f"0=4096M,{UUID_B}=4096M")
    with pytest.raises(ValueError, match="needs GPU UUIDs"):
        format_pinned_mem_limit_by_uuid(4096, ["1"])


@pytest.mark.parametrize("bound", [UUID_B, "1", "nvidia.com/gpu=1", f"k8s.device-plugin.nvidia.com/gpu={UUID_B}"],
                         ids=["uuid", "index-through-nvml", "cdi-by-index", "cdi-by-uuid"])
def test_a_fraction_is_created_with_its_pinned_limit_keyed_by_uuid(bound: str) -> None:
    pod, ctr = fraction(bound)
    assert ctr.env[PINNED] == "0=4096M"  # what the webhook's fieldRef gave it: the client's index
    result = decide(pod, ctr, NODE)
    assert isinstance(result, Injection) and result.outcome is Outcome.INJECTED
    assert result.set_env == {PINNED: f"{UUID_B}=4096M"}


def test_two_gpus_are_keyed_each_by_its_own_uuid() -> None:
    pod, ctr = fraction(f"{UUID_A},{UUID_B}")
    result = decide(pod, ctr, NODE)
    assert isinstance(result, Injection)
    assert result.set_env == {PINNED: f"{UUID_A}=4096M,{UUID_B}=4096M"}


def test_without_nvml_an_index_keeps_the_webhooks_value_rather_than_a_wrong_key() -> None:
    pod, ctr = fraction("1")
    no_nvml = replace(NODE, gpus=(), device_nodes={"/dev/nvidia1": DeviceNode("/dev/nvidia1", 195, 1)})
    result = decide(pod, ctr, no_nvml)
    assert isinstance(result, Injection) and result.outcome is Outcome.INJECTED
    assert PINNED not in result.set_env


def test_the_audit_accepts_the_uuid_keyed_env_and_still_catches_a_raised_limit() -> None:
    running = container("app", devices=(UUID_B,))
    env = injected_env(running)
    assert env_mismatches(running, {**env, PINNED: f"{UUID_B}=4096M"}) == ([], [])
    _, wrong = env_mismatches(running, {**env, PINNED: f"{UUID_B}=81920M"})
    assert wrong and PINNED in wrong[0]
    assert not pinned_limit_agrees(f"0=4096M,{UUID_B}=4096M", {0: 4096})
    assert not pinned_limit_agrees(f"{UUID_A}=4096M,{UUID_B}=4096M", {0: 4096})


def test_a_foreign_uuid_pinned_entry_is_a_mismatch() -> None:
    """Issue 43, audit by identity: the right value keyed by another GPU's UUID drops every pinned limit of the
    process (NVIDIA's measurement), so it does not agree, though its value matches the declared one."""
    running = container("app", devices=(UUID_B,))
    env = injected_env(running)
    _, wrong = env_mismatches(running, {**env, PINNED: f"{UUID_A}=4096M"})
    assert wrong and PINNED in wrong[0], wrong
    _, wrong = env_mismatches(running, {**env, PINNED: "GPU-00000000-0000-0000-0000-bogus0000000=4096M"})
    assert wrong and PINNED in wrong[0], wrong
    assert env_mismatches(running, {**env, PINNED: f"{UUID_B}=4096M"}) == ([], [])


# ---- row 4: an sm-sharing fraction outside its MPS daemon ----

def test_an_sm_sharing_fraction_without_its_pipe_directory_is_refused() -> None:
    pod, ctr = fraction(mode=ComputeMode.SM_SHARING, mounts=RUNTIME_MOUNTS)
    result = decide(pod, ctr, NODE)
    assert isinstance(result, Refusal), result
    assert result.reason is RefusalReason.PIPE_DIR_MISSING
    assert f"CUDA_MPS_PIPE_DIRECTORY={SM_PIPE} is not a mount" in result.message
    assert "ordinary CUDA process with the whole GPU" in result.message


def test_a_volume_above_the_pipe_directory_does_not_count() -> None:
    pod, ctr = fraction(mode=ComputeMode.SM_SHARING, mounts=(*RUNTIME_MOUNTS, DEFAULT_MPS_ROOT))
    result = decide(pod, ctr, NODE)
    assert isinstance(result, Refusal) and result.reason is RefusalReason.PIPE_DIR_MISSING


def test_an_sm_sharing_fraction_with_its_pipe_directory_is_created() -> None:
    pod, ctr = fraction(mode=ComputeMode.SM_SHARING, mounts=(*RUNTIME_MOUNTS, SM_PIPE + "/", "/dev/shm"))
    result = decide(pod, ctr, NODE)
    assert isinstance(result, Injection) and result.outcome is Outcome.INJECTED


def test_a_pipe_directory_of_another_path_is_refused() -> None:
    pod, ctr = fraction(mode=ComputeMode.SM_SHARING, mounts=(*RUNTIME_MOUNTS, SM_PIPE))
    moved = replace(ctr, env={**ctr.env, "CUDA_MPS_PIPE_DIRECTORY": "/tmp/mine/sm-sharing"})
    result = decide(pod, moved, NODE)
    assert isinstance(result, Refusal) and result.reason is RefusalReason.PIPE_DIR_MISSING


# ---- row 8: a name written twice, and a legacy CUDA image ----

def test_a_grant_written_twice_is_refused_not_voided() -> None:
    pod, ctr = plain({"NVIDIA_VISIBLE_DEVICES": UUID_A}, "NVIDIA_VISIBLE_DEVICES=all")
    result = decide(pod, ctr, NODE)
    assert isinstance(result, Refusal), result
    assert result.reason is RefusalReason.ENV_DUPLICATED
    assert "sets NVIDIA_VISIBLE_DEVICES more than once" in result.message


def test_the_same_grant_written_once_is_voided() -> None:
    pod, ctr = plain({"NVIDIA_VISIBLE_DEVICES": UUID_A})
    result = decide(pod, ctr, NODE)
    assert isinstance(result, Injection) and result.set_env == {"NVIDIA_VISIBLE_DEVICES": "void"}


def test_a_fraction_whose_pinned_limit_is_written_twice_is_refused() -> None:
    pod, ctr = fraction(image_env=(f"{PINNED}=0=81920M",))
    result = decide(pod, ctr, NODE)
    assert isinstance(result, Refusal) and result.reason is RefusalReason.ENV_DUPLICATED
    assert PINNED in result.message


def test_a_fraction_in_a_cuda_image_that_says_all_is_created() -> None:
    pod, ctr = fraction(image_env=("NVIDIA_VISIBLE_DEVICES=all", "CUDA_VERSION=13.4.0"))
    result = decide(pod, ctr, NODE)
    assert isinstance(result, Injection) and result.outcome is Outcome.INJECTED  # gpufrac edits no such name


def test_a_legacy_cuda_image_is_refused_rather_than_blanked() -> None:
    pod, ctr = plain({"PATH": "/usr/bin"}, "CUDA_VERSION=11.8.0")
    result = decide(pod, ctr, NODE)
    assert isinstance(result, Refusal) and result.reason is RefusalReason.LEGACY_IMAGE
    assert "NVIDIA_VISIBLE_DEVICES=void" in result.message
    pod, ctr = plain({"NVIDIA_VISIBLE_DEVICES": "void"}, "CUDA_VERSION=11.8.0")
    assert decide(pod, ctr, NODE) == Injection(Outcome.UNTOUCHED)


def test_the_wire_hands_the_decision_every_env_entry() -> None:
    sandbox = pod_sandbox("web", "u1", {})
    message = nri_container("c1", "web", sandbox, {"NVIDIA_VISIBLE_DEVICES": UUID_A})
    message.env.insert(0, "NVIDIA_VISIBLE_DEVICES=all")
    seen = container_info(message)
    assert seen.env == {"NVIDIA_VISIBLE_DEVICES": UUID_A}
    assert seen.env_entries == ("NVIDIA_VISIBLE_DEVICES=all", f"NVIDIA_VISIBLE_DEVICES={UUID_A}")


# ---- row 1 beyond the webhook's sight (envFrom, the image), and naming GPUs not given ----

@pytest.mark.parametrize("name", ["NVIDIA_GPU_MEMORY_LIMITS", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                                  "CUDA_MPS_CLIENT_PRIORITY"])
def test_a_name_gpufrac_owns_but_did_not_set_is_refused(name: str) -> None:
    pod, ctr = fraction()  # time-slicing: gpufrac sets no thread percentage for it
    from_config_map = replace(ctr, env={**ctr.env, name: "81920"})
    result = decide(pod, from_config_map, NODE)
    assert isinstance(result, Refusal), result
    assert result.reason is RefusalReason.LIMIT_ENV_MISMATCH and f"carries {name}, which gpufrac owns" in result.message


def test_an_sm_sharing_fraction_keeps_the_thread_percentage_gpufrac_set() -> None:
    pod, ctr = fraction(mode=ComputeMode.SM_SHARING, mounts=(*RUNTIME_MOUNTS, SM_PIPE))
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in ctr.env
    assert isinstance(decide(pod, ctr, NODE), Injection)


def test_cuda_visible_devices_naming_another_gpu_is_refused_and_an_index_is_not() -> None:
    pod, ctr = fraction(UUID_B)
    result = decide(pod, replace(ctr, env={**ctr.env, "CUDA_VISIBLE_DEVICES": UUID_A}), NODE)
    assert isinstance(result, Refusal) and UUID_A in result.message and "CUDA_VISIBLE_DEVICES" in result.message
    assert isinstance(decide(pod, replace(ctr, env={**ctr.env, "CUDA_VISIBLE_DEVICES": UUID_B}), NODE), Injection)
    assert isinstance(decide(pod, replace(ctr, env={**ctr.env, "CUDA_VISIBLE_DEVICES": "0"}), NODE), Injection)


def test_devices_naming_every_gpu_are_refused_even_where_a_spec_defines_all() -> None:
    pod, ctr = fraction("nvidia.com/gpu=all")
    result = decide(pod, ctr, replace(NODE, cdi_devices=NODE.cdi_devices | {"nvidia.com/gpu=all"}))
    # one GPU per entry (core.annotations.parse_devices): the fraction does not even read
    assert isinstance(result, Refusal) and result.reason is RefusalReason.UNREADABLE, result
    assert "nvidia.com/gpu=all" in result.message, result.message
