"""The agent with its NRI plugin, in one process: real pynvml over the fake libnvidia-ml.so.1, the fake MPS daemons,
CDI specs and device nodes in a temporary directory, an in-memory Kubernetes API, and the runtime stand-in on a
unix socket. The plugin code is the agent's own (NriService, NriPlugin, the wire session, the decision)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from e2e.toolkit.wait import wait_until
from gpufrac.agent.decide.mps_namespaces import namespace_name
from gpufrac.agent.edges.cdi_specs import CdiSpecs
from gpufrac.agent.edges.metrics import AgentMetrics
from gpufrac.agent.edges.nvml import NvmlSource
from gpufrac.agent.edges.supervisor import RestartPolicy
from gpufrac.agent.node.node_loop import Agent
from gpufrac.agent.nri.config import NriConfig
from gpufrac.agent.nri.service import NriService
from gpufrac.agent.nri.stubs import api_pb2
from gpufrac.core.annotations import ComputeMode
from testkit.agent import UUID_A, UUID_B, canonical_annotations, container, injected_env, two_pod_node, value
from testkit.fakes.mps_client import connect, records
from testkit.nri_runtime import FakeRuntime, nri_container, pod_sandbox

PINNED = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"


def write_cdi_spec(directory: Path) -> None:
    """NVIDIA's toolkit's shape: kind nvidia.com/gpu, devices by index and by UUID."""
    directory.mkdir(parents=True, exist_ok=True)
    devices = [{"name": name, "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{index}"}]}}
               for index, uuid in enumerate((UUID_A, UUID_B)) for name in (str(index), uuid)]
    (directory / "nvidia.json").write_text(json.dumps({
        "cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": devices,
        "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}]}}))


class World:
    def __init__(self, tmp: Path, kube: Any, agent: Agent, service: NriService, runtime: FakeRuntime | None) -> None:
        self.tmp, self.kube, self.agent, self.service, self.runtime = tmp, kube, agent, service, runtime


@pytest.fixture
def world(tmp_path: Path, fake_gpus: Any, mps_binary: str) -> Iterator[World]:
    fake_gpus.gpu(UUID_A, memory_total_mib=80000).gpu(UUID_B, memory_total_mib=80000)
    _, kube, config = two_pod_node(tmp_path, mps_binary, RestartPolicy(0.01, 0.05, 3, 300.0))
    write_cdi_spec(tmp_path / "cdi")
    runtime = FakeRuntime(tmp_path / "nri.sock")
    metrics = AgentMetrics(node=config.node)
    agent = Agent(config, kube, NvmlSource(), metrics, doors=[
        lambda node: NriService(NriConfig(runtime.path, lock_file=tmp_path / "nri.lock"), node, kube, metrics,
                                cdi=CdiSpecs([tmp_path / "cdi"]), dev_root=tmp_path / "dev")])
    agent.start()
    [service] = agent.doors.all
    assert isinstance(service, NriService)
    service.start()
    yield World(tmp_path, kube, agent, service, runtime)
    service.stop()
    runtime.close()
    agent.shutdown()


def serve_both_modes(agent: Agent) -> None:
    agent.tick()
    assert wait_until(lambda: all(s.up for s in agent.daemon_statuses().values()) and len(agent.daemon_statuses()) == 2)
    agent.tick()


def registered(world: World, serve: Callable[[Agent], None], request_timeout_ms: int = 2000) -> FakeRuntime:
    """The agent ticked (so its plugin registers), the runtime stand-in accepted it and synchronized nothing."""
    serve(world.agent)
    runtime = world.runtime
    assert runtime is not None
    runtime.accept()
    runtime.handshake(request_timeout_ms=request_timeout_ms)
    return runtime


def fraction(world: World, uid: str, mode: str, devices: str) -> tuple[Any, dict[str, str]]:
    """A bound fractional pod and its container's env, with the pipe directories of the agent's --mps-root."""
    annotations = canonical_annotations("app", request_mib=1024, limit_mib=2048, devices=devices.split(","), mode=mode)
    env = injected_env(container("app", mode=ComputeMode(mode), request_mib=1024, limit_mib=2048,
                                 devices=tuple(devices.split(","))), str(world.agent.config.mps_root))
    return pod_sandbox(f"pod-{uid}", uid, annotations), env


def test_the_agents_plugin_hands_out_gpus_and_refuses_with_an_event(world: World) -> None:
    serve_both_modes(world.agent)
    runtime = world.runtime
    assert runtime is not None
    assert runtime.accept().plugin_name == "gpufrac"  # only after the first tick
    train, train_env = fraction(world, "u-train", "time-slicing", UUID_A)
    # a deadline the fake MPS control commands meet on a loaded machine too (containerd's default, 2 s, leaves the
    # daemon 1 s; the hold within its deadline is tests/agent/test_daemon_side_limits.py's)
    runtime.handshake([train], [nri_container("c-train", "app", train, train_env, api_pb2.CONTAINER_RUNNING)],
                      request_timeout_ms=10000)
    assert value(world.agent.metrics, "gpufrac_nri_plugin_state", state="registered") == 1

    infer, infer_env = fraction(world, "u-infer", "sm-sharing", "1")
    answer = runtime.create(infer, nri_container("c-infer", "app", infer, infer_env))
    assert answer.status.code == 0, answer.status.message
    adjust = api_pb2.CreateContainerResponse.FromString(answer.payload).adjust
    assert [d.name for d in adjust.CDI_devices] == [f"nvidia.com/gpu={UUID_B}"]

    clash, clash_env = fraction(world, "u-clash", "sm-sharing", UUID_A)
    refused = runtime.create(clash, nri_container("c-clash", "app", clash, clash_env))
    assert refused.status.code == 9
    assert f"GPU {UUID_A} serves time-slicing to container app of pod team-a/pod-u-train" in refused.status.message
    assert wait_until(lambda: any(e["reason"] == "GPUServesOtherMode" for e in world.kube.events.values()))
    event = next(e for e in world.kube.events.values() if e["reason"] == "GPUServesOtherMode")
    assert event["type"] == "Warning" and event["message"] == refused.status.message
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "team-a",
                                       "name": "pod-u-clash", "uid": "u-clash", "fieldPath": "spec.containers{app}"}
    # the kubelet retries: the same refusal finds its Event, adds none
    runtime.create(clash, nri_container("c-clash2", "app", clash, clash_env))
    assert wait_until(lambda: world.kube.create_event_calls == 2)
    assert sum(e["reason"] == "GPUServesOtherMode" for e in world.kube.events.values()) == 1

    plain = pod_sandbox("plain", "u-plain", {})
    voided = runtime.create(plain, nri_container("c-plain", "cuda", plain, {"NVIDIA_VISIBLE_DEVICES": "all"}))
    env = api_pb2.CreateContainerResponse.FromString(voided.payload).adjust.env
    assert [(e.key, e.value) for e in env] == [("NVIDIA_VISIBLE_DEVICES", "void")]

    metrics = world.agent.metrics
    assert value(metrics, "gpufrac_nri_containers_total", outcome="injected") == 1
    assert value(metrics, "gpufrac_nri_containers_total", outcome="refused") == 2
    assert value(metrics, "gpufrac_nri_containers_total", outcome="voided") == 1


def test_a_gpu_no_cdi_spec_names_is_refused_not_handed_out_bare(world: World) -> None:
    """Issue 29: a bare device node carries no driver libraries; the runtime the plugin registered with is known."""
    for spec in (world.tmp / "cdi").iterdir():
        spec.unlink()
    dev = world.tmp / "dev"
    dev.mkdir()
    try:
        for name, minor in (("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)):
            os.mknod(dev / name, stat.S_IFCHR | 0o666, os.makedev(195, minor))
    except PermissionError:
        pytest.skip("making character devices needs root")
    runtime = registered(world, serve_both_modes)
    pod, env = fraction(world, "u1", "time-slicing", UUID_B)
    refused = runtime.create(pod, nri_container("c1", "app", pod, env))
    assert refused.status.code == 9
    assert f"no CDI spec on this node names GPU {UUID_B}" in refused.status.message
    assert "nvidia-ctk cdi generate" in refused.status.message
    assert wait_until(lambda: any(e["reason"] == "GPUWithoutCdiSpec" for e in world.kube.events.values()))


def test_a_mode_the_node_does_not_enforce_is_refused(world: World, fake_gpus: Any) -> None:
    fake_gpus.set(driver_version="550.54.15", cuda_driver_version=12040)  # no CUDA 13.4 limits: no time-slicing
    runtime = registered(world, serve_sm_sharing_only)
    pod, env = fraction(world, "u1", "time-slicing", UUID_B)
    refused = runtime.create(pod, nri_container("c1", "app", pod, env))
    assert refused.status.code == 9
    assert "time-slicing GPU fraction, which this node does not enforce now: driver 550.54.15" in (
        refused.status.message)


def serve_sm_sharing_only(agent: Agent) -> None:
    agent.tick()
    assert wait_until(lambda: agent.daemon_statuses().get(ComputeMode.SM_SHARING) is not None
                      and agent.daemon_statuses()[ComputeMode.SM_SHARING].up)
    agent.tick()


@pytest.mark.parametrize("env_fallback", [False, True])
def test_without_an_nri_socket_the_agent_says_so(tmp_path: Path, fake_gpus: Any, mps_binary: str,
                                                  env_fallback: bool) -> None:
    """No NRI (containerd 1.7, GKE <= 1.32): by default the node is not Ready for fractions; with the operator's
    opt-in (nri.envFallback) it is, and says that the env var alone hands the GPUs out."""
    fake_gpus.gpu(UUID_A, memory_total_mib=80000)
    _, kube, config = two_pod_node(tmp_path, mps_binary, RestartPolicy(0.01, 0.05, 3, 300.0))
    metrics = AgentMetrics(node=config.node)
    agent = Agent(replace(config), kube, NvmlSource(), metrics, doors=[
        lambda node: NriService(NriConfig(tmp_path / "absent" / "nri.sock", lock_file=None, retry_interval=0.05,
                                          env_fallback=env_fallback), node, kube, metrics, cdi=CdiSpecs([]))])
    agent.start()
    [service] = agent.doors.all
    assert isinstance(service, NriService)
    service.start()
    try:
        serve_both_modes(agent)
        assert wait_until(lambda: value(metrics, "gpufrac_nri_plugin_state", state="no-socket") == 1)
        agent.tick()
        condition = kube.last_condition()
        assert "no NRI socket at" in condition["message"] and "NVIDIA_VISIBLE_DEVICES only" in condition["message"]
        if env_fallback:
            assert (condition["status"], condition["reason"]) == ("True", "NriUnavailable")
            assert condition["message"].startswith("GPU memory fractions are enforced")
        else:
            assert (condition["status"], condition["reason"]) == ("False", "NriUnavailable")
            assert "nri.envFallback=true" in condition["message"]
            assert condition["message"].count("no NRI socket at") == 1
    finally:
        service.stop()
        agent.shutdown()


def test_an_sm_sharing_fraction_is_held_by_the_daemon_before_its_creation_is_answered(world: World) -> None:
    """Issue 30: a fraction created within one pass of its bind (its pod not even in the watch yet) starts under its
    own daemon-side limit, not the daemon's previous one: the plugin tells the daemon before it answers, and the
    loop's next pass keeps it. (A runtime that waits 10 s: the fake daemon's client is a Python program, which a
    loaded machine may start more slowly than half of containerd's default 2 s.)"""
    runtime = registered(world, serve_both_modes, request_timeout_ms=10000)
    pipe, log_dir = world.tmp / "mps" / "sm-sharing", world.tmp / "log" / "sm-sharing"
    assert connect(pipe, UUID_A, env={}).pinned_mib is None  # GPU A had no sm-sharing fraction: no daemon limit
    new, new_env = fraction(world, "u-new", "sm-sharing", UUID_A)
    answer = runtime.create(new, nri_container("c-new", "app", new, new_env))
    assert answer.status.code == 0, answer.status.message
    assert records(log_dir, "limit")[-1]["defaults"]["pinned"][UUID_A] == 2048
    assert connect(pipe, UUID_A, env={}).pinned_mib == 2048  # its process dropped its env: held all the same
    world.agent.tick()
    assert connect(pipe, UUID_A, env={PINNED: f"{UUID_A}=80000M"}).pinned_mib == 2048


def test_a_fraction_whose_limits_the_daemon_does_not_take_is_refused_at_creation(world: World) -> None:
    runtime = registered(world, serve_both_modes)
    limits = world.agent.daemon_limits
    assert limits is not None
    limits.pipe_dir = world.tmp / "no-daemon-here"  # the daemon cannot be told
    new, new_env = fraction(world, "u-new", "sm-sharing", UUID_A)
    refused = runtime.create(new, nri_container("c-new", "app", new, new_env))
    assert refused.status.code != 0
    assert refused.status.message.startswith(
        "container app of pod team-a/pod-u-new is an sm-sharing GPU fraction, but the MPS daemon could not be told "
        "its limits ('get_server_list' to the MPS daemon in "), refused.status.message
    assert wait_until(lambda: any(e["reason"] == "GPUMpsLimitsNotSet" for e in world.kube.events.values()))
    train, train_env = fraction(world, "u-train", "time-slicing", UUID_B)  # no daemon side to hold
    assert runtime.create(train, nri_container("c-train", "app", train, train_env)).status.code == 0


def test_a_fraction_whose_request_does_not_fit_next_to_the_owed_ones_is_refused_with_the_numbers(world: World) -> None:
    """GPU A (80000 MiB, less the driver's reserve) holds the node's `train` pod's 20000 MiB request: a new fraction
    asking 70000 MiB there is refused at creation, naming the usable memory and who holds it; 50000 MiB fits."""
    runtime = registered(world, serve_both_modes)
    usable = world.agent.audit.guarantee.usable_mib[UUID_A]
    assert 70000 < usable <= 80000

    def created(uid: str, request_mib: int) -> Any:
        annotations = canonical_annotations("app", request_mib=request_mib, limit_mib=request_mib, devices=[UUID_A],
                                            mode="time-slicing")
        env = injected_env(container("app", mode=ComputeMode.TIME_SLICING, request_mib=request_mib,
                                     limit_mib=request_mib, devices=(UUID_A,)), str(world.agent.config.mps_root))
        pod = pod_sandbox(f"pod-{uid}", uid, annotations)
        return runtime.create(pod, nri_container(f"c-{uid}", "app", pod, env))

    refused = created("u-big", 70000)
    assert refused.status.code == 9
    assert refused.status.message == (
        f"container app of pod team-a/pod-u-big is a time-slicing GPU fraction, but its request of 70000 MiB does "
        f"not fit on GPU {UUID_A}: {usable} MiB usable there, 20000 MiB of it requested by the fractions placed "
        "there (team-a/train (app) 20000 MiB); it is created once the others leave room")
    assert wait_until(lambda: any(e["reason"] == "GPURequestDoesNotFit" for e in world.kube.events.values()))
    assert created("u-fits", 50000).status.code == 0


def test_on_mps_v3_an_sm_sharing_fractions_pipe_directory_is_its_own_namespace(world: World) -> None:
    """Issue 30, limits a process cannot raise: on r615 each sm-sharing fraction is given the directory of an MPS v3
    namespace of its own, with its own limit, in place of the daemon's whole pipe directory. A neighbour on the same
    GPU with a larger limit raises the server's limit, not this one's; time-slicing keeps its mount."""
    runtime = registered(world, serve_both_modes, request_timeout_ms=10000)
    pipe = world.tmp / "mps" / "sm-sharing"
    small, small_env = fraction(world, "u-small", "sm-sharing", UUID_A)
    answer = runtime.create(small, nri_container("c-small", "app", small, small_env))
    assert answer.status.code == 0, answer.status.message
    (mount,) = api_pb2.CreateContainerResponse.FromString(answer.payload).adjust.mounts
    own = pipe / "gpufrac" / namespace_name("u-small", "app")
    assert (mount.destination, mount.source, mount.type) == (small_env["CUDA_MPS_PIPE_DIRECTORY"], str(own), "bind")
    assert sorted(p.name for p in own.iterdir()) == ["control", "fake-context-share", "fake-server-limits"]

    annotations = canonical_annotations("app", request_mib=1024, limit_mib=30000, devices=[UUID_A],
                                        mode="sm-sharing")
    large = pod_sandbox("pod-u-large", "u-large", annotations)
    large_env = {**small_env, "NVIDIA_GPU_MEMORY_LIMIT": "30000", PINNED: f"{UUID_A}=30000M"}
    assert runtime.create(large, nri_container("c-large", "app", large, large_env)).status.code == 0
    assert connect(pipe, UUID_A, env={}).pinned_mib == 30000  # the server's: the largest of its fractions
    assert connect(own, UUID_A, env={PINNED: f"{UUID_A}=80000M"}).pinned_mib == 2048  # its own namespace's
    # an env naming a GPU it cannot see drops every pinned limit, its namespace's too (NVIDIA's measurement):
    # only the cgroup limit holds that container (tests/agent/test_hard_limit.py)
    assert connect(own, UUID_A, visible=(UUID_A,), env={PINNED: "0=2048M,1=2048M"}).pinned_mib is None

    train, train_env = fraction(world, "u-train", "time-slicing", UUID_B)
    answer = runtime.create(train, nri_container("c-train", "app", train, train_env))
    assert list(api_pb2.CreateContainerResponse.FromString(answer.payload).adjust.mounts) == []


def test_before_r615_an_sm_sharing_fraction_keeps_the_daemons_pipe_directory(world: World, fake_gpus: Any) -> None:
    fake_gpus.set(driver_version="550.54.15", cuda_driver_version=12040)
    runtime = registered(world, lambda agent: (agent.tick(), wait_until(
        lambda: agent.daemon_statuses().get(ComputeMode.SM_SHARING) is not None
        and agent.daemon_statuses()[ComputeMode.SM_SHARING].up), agent.tick()), request_timeout_ms=10000)
    new, new_env = fraction(world, "u-new", "sm-sharing", UUID_A)
    answer = runtime.create(new, nri_container("c-new", "app", new, new_env))
    assert answer.status.code == 0, answer.status.message
    assert list(api_pb2.CreateContainerResponse.FromString(answer.payload).adjust.mounts) == []
    assert not (world.tmp / "mps" / "sm-sharing" / "gpufrac").exists()


def test_a_daemonset_pod_voided_or_refused_gets_a_warning_event_and_a_metric(world: World) -> None:
    """A node-wide component gpufrac did not recognise as the GPU stack (its namespace not trusted, no device-plugins
    bind): its voided env, or its refusal, is counted and reported, so the operator sees it before it loses GPUs."""
    runtime = registered(world, serve_both_modes)
    daemonset = {"pod-template-generation": "1", "controller-revision-hash": "6d9f"}
    exporter = pod_sandbox("dcgm-exporter-x1", "u-dcgm", {}, namespace="monitoring", labels=daemonset)
    voided = runtime.create(exporter, nri_container("c-dcgm", "exporter", exporter, {"NVIDIA_VISIBLE_DEVICES": "all"}))
    env = api_pb2.CreateContainerResponse.FromString(voided.payload).adjust.env
    assert [(e.key, e.value) for e in env] == [("NVIDIA_VISIBLE_DEVICES", "void")]
    assert wait_until(lambda: any(e["reason"] == "DaemonSetGpuEnvVoided" for e in world.kube.events.values()))
    event = next(e for e in world.kube.events.values() if e["reason"] == "DaemonSetGpuEnvVoided")
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "dcgm-exporter-x1"
    assert "nri.trustedNamespaces" in event["message"] and "NVIDIA_VISIBLE_DEVICES=all" in event["message"]
    metrics = world.agent.metrics
    assert value(metrics, "gpufrac_nri_daemonset_pods_total", outcome="voided") == 1

    # the same env written twice (image and pod): refused, counted as a DaemonSet's refusal
    twice = pod_sandbox("gfd-x2", "u-gfd", {}, namespace="monitoring", labels=daemonset)
    ctr = nri_container("c-gfd", "gfd", twice, {"NVIDIA_VISIBLE_DEVICES": "all"})
    ctr.env.append("NVIDIA_VISIBLE_DEVICES=all")
    assert runtime.create(twice, ctr).status.code != 0
    assert wait_until(lambda: value(metrics, "gpufrac_nri_daemonset_pods_total", outcome="refused") == 1)

    # a plain pod (no DaemonSet) voided: no such Event, no count
    plain = pod_sandbox("plain", "u-plain", {}, namespace="monitoring")
    runtime.create(plain, nri_container("c-plain", "cuda", plain, {"NVIDIA_VISIBLE_DEVICES": "all"}))
    assert value(metrics, "gpufrac_nri_daemonset_pods_total", outcome="voided") == 1
    assert sum(e["reason"] == "DaemonSetGpuEnvVoided" for e in world.kube.events.values()) == 1
