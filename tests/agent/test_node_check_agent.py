"""The agent reports a delivery path that cannot work (containerd < 2.1, a GPU no CDI spec names) as its node
condition's reason, a metric and a Warning Event on the Node; its NRI plugin refuses a fraction that would get no
working GPU. One process: real pynvml over the fake libnvidia-ml.so.1, the fake MPS daemons, CDI specs in a temporary
directory, an in-memory Kubernetes API and the runtime stand-in on a unix socket, which reports the runtime version
the test chooses in NRI's Configure, as containerd does."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from e2e.toolkit.wait import wait_until
from gpufrac.agent.decide.runtime_support import DeliveryFacts
from gpufrac.agent.edges.metrics import AgentMetrics
from gpufrac.agent.edges.nvml import NvmlSource
from gpufrac.agent.edges.supervisor import RestartPolicy
from gpufrac.agent.node.node_loop import Agent
from gpufrac.agent.nri.config import NriConfig
from gpufrac.agent.nri.decide.creation import DeviceNode, NodeFacts, Refusal, RefusalReason
from gpufrac.agent.nri.plugin import NriPlugin
from gpufrac.agent.nri.service import NriService
from gpufrac.agent.nri.stubs import api_pb2
from gpufrac.agent.programs.node_agent import nri_door
from gpufrac.cli import build_parser
from gpufrac.core.annotations import ComputeMode
from testkit.agent import (
    UUID_A,
    UUID_B,
    canonical_annotations,
    container,
    gpu_info,
    injected_env,
    two_pod_node,
    value,
)
from testkit.nri_plugin import RecordingSink, halt_plugin
from testkit.nri_runtime import FakeRuntime, nri_container, pod_sandbox


def write_cdi_spec(directory: Path, gpus: tuple[tuple[int, str], ...]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    devices = [{"name": name, "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{index}"}]}}
               for index, uuid in gpus for name in (str(index), uuid)]
    (directory / "nvidia.json").write_text(json.dumps({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
                                                      "devices": devices}))


def handshake(runtime: FakeRuntime, version: str) -> None:
    """Configure (naming the runtime's version) and an empty Synchronize, as containerd does after registration."""
    configured = runtime.call("Configure", api_pb2.ConfigureRequest(
        runtime_name="containerd", runtime_version=version, registration_timeout=5000, request_timeout=2000))
    assert configured.status.code == 0, configured.status.message
    assert runtime.call("Synchronize", api_pb2.SynchronizeRequest()).status.code == 0


class World:
    def __init__(self, tmp: Path, kube: Any, agent: Agent, service: NriService, runtime: FakeRuntime) -> None:
        self.tmp, self.kube, self.agent, self.service, self.runtime = tmp, kube, agent, service, runtime


@pytest.fixture
def world(tmp_path: Path, fake_gpus: Any, mps_binary: str) -> Iterator[World]:
    """The agent wired as `gpufrac agent --nri` wires it (node_agent.nri_door), CDI specs naming both GPUs."""
    fake_gpus.gpu(UUID_A, memory_total_mib=80000).gpu(UUID_B, memory_total_mib=80000)
    _, kube, config = two_pod_node(tmp_path, mps_binary, RestartPolicy(0.01, 0.05, 3, 300.0))
    write_cdi_spec(tmp_path / "cdi", ((0, UUID_A), (1, UUID_B)))
    runtime = FakeRuntime(tmp_path / "nri.sock")
    args = build_parser("agent").parse_args([
        "agent", "--node", config.node, "--nri", "--nri-socket", str(runtime.path),
        "--nri-lock-file", str(tmp_path / "nri.lock"), "--cdi-spec-dir", str(tmp_path / "cdi"),
        "--proc-root", str(config.proc_root)])
    metrics = AgentMetrics(node=config.node)
    door = nri_door(args, kube, metrics)
    assert door is not None
    agent = Agent(config, kube, NvmlSource(), metrics, doors=[door])
    agent.start()
    [service] = agent.doors.all
    assert isinstance(service, NriService)
    assert service.plugin.config.proc_root == config.proc_root  # where it checks a process before stopping it
    service.start()
    yield World(tmp_path, kube, agent, service, runtime)
    service.stop()
    runtime.close()
    agent.shutdown()


def registered_with(world: World, version: str) -> None:
    world.agent.tick()
    assert wait_until(lambda: len(world.agent.daemon_statuses()) == 2
                      and all(s.up for s in world.agent.daemon_statuses().values()))
    world.runtime.accept()
    handshake(world.runtime, version)
    assert wait_until(lambda: world.service.plugin.runtime == f"containerd {version}")
    world.agent.tick()


def node_events(kube: Any, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.events.values() if e["reason"] == reason and e["involvedObject"]["kind"] == "Node"]


def test_containerd_2_0_makes_the_condition_false_with_a_metric_and_one_event(world: World) -> None:
    registered_with(world, "v2.0.5")
    last = world.kube.last_condition()
    assert (last["status"], last["reason"]) == ("False", "ContainerdTooOld")
    assert "containerd 2.0.5 drops the CDI devices NRI plugins inject" in last["message"]
    assert "upgrade containerd to 2.1 or later" in last["message"]
    kai = world.kube.last_condition("gpu-sharing.nvidia.com/Ready")
    assert (kai["status"], kai["reason"]) == ("False", "ContainerdTooOld")  # KAI places no fraction here
    metrics = world.agent.metrics
    assert value(metrics, "gpufrac_node_runtime_problem", reason="ContainerdTooOld") == 1
    assert value(metrics, "gpufrac_node_runtime_problem", reason="NoCdiSpecForGpu") == 0
    world.agent.tick()
    events = node_events(world.kube, "ContainerdTooOld")
    assert len(events) == 1 and events[0]["involvedObject"]["name"] == world.agent.config.node
    assert events[0]["type"] == "Warning" and events[0]["message"] in last["message"]


def test_a_gpu_without_cdi_spec_is_reported_until_a_spec_names_it(world: World) -> None:
    write_cdi_spec(world.tmp / "cdi", ((0, UUID_A),))  # the spec lost GPU 1
    registered_with(world, "v2.4.2")
    last = world.kube.last_condition()
    assert (last["status"], last["reason"]) == ("False", "NoCdiSpecForGpu")
    assert f"names GPU(s) 1 ({UUID_B})" in last["message"] and "nvidia-ctk cdi generate" in last["message"]
    assert value(world.agent.metrics, "gpufrac_node_runtime_problem", reason="NoCdiSpecForGpu") == 1
    assert len(node_events(world.kube, "NoCdiSpecForGpu")) == 1

    time.sleep(0.01)  # a new mtime: the spec cache reads it again
    write_cdi_spec(world.tmp / "cdi", ((0, UUID_A), (1, UUID_B)))
    world.agent.tick()
    last = world.kube.last_condition()
    assert (last["status"], last["reason"]) == ("True", "FractionsEnforced")
    assert value(world.agent.metrics, "gpufrac_node_runtime_problem", reason="NoCdiSpecForGpu") == 0


def test_no_nri_socket_is_the_plugins_reason_with_a_metric_and_an_event_and_cdi_specs_do_not_matter(
        world: World) -> None:
    write_cdi_spec(world.tmp / "cdi", ())
    world.runtime.close()
    world.runtime.path.unlink()
    world.agent.tick()
    assert wait_until(lambda: world.service.problem() is not None)
    world.agent.tick()
    last = world.kube.last_condition()
    assert last["reason"] in ("NriUnavailable", "MpsDaemonNotReady")
    assert "NoCdiSpecForGpu" not in last["message"] and "no CDI spec" not in last["message"]
    metrics = world.agent.metrics
    assert value(metrics, "gpufrac_node_runtime_problem", reason="NoCdiSpecForGpu") == 0
    assert value(metrics, "gpufrac_node_runtime_problem", reason="NriUnavailable") == 1
    world.agent.tick()
    (event,) = node_events(world.kube, "NriUnavailable")
    assert "has no NRI socket" in event["message"] and "NVIDIA_VISIBLE_DEVICES" in event["message"]


# ---- the NRI plugin's refusal, with the runtime's facts from its own registration ----

FACTS = NodeFacts((gpu_info(0, UUID_A), gpu_info(1, UUID_B)), frozenset({f"nvidia.com/gpu={UUID_B}"}), {},
                  dict.fromkeys(ComputeMode))


def fraction_pod(uid: str, device: str) -> tuple[Any, Any]:
    annotations = canonical_annotations("app", request_mib=1024, limit_mib=2048, devices=[device])
    pod = pod_sandbox(f"pod-{uid}", uid, annotations)
    env = injected_env(container("app", request_mib=1024, limit_mib=2048, devices=(device,)))
    return pod, nri_container(f"c-{uid}", "app", pod, env)


def plugin_with_runtime_facts(runtime: FakeRuntime, sink: RecordingSink, facts: Callable[[str], NodeFacts],
                              ) -> tuple[NriPlugin, threading.Event, threading.Thread]:
    """The plugin whose facts carry the runtime it registered with (what NriService.facts is to pass)."""
    holder: list[NriPlugin] = []
    plugin = NriPlugin(NriConfig(runtime.path, lock_file=None), lambda: facts(holder[0].runtime), sink)
    holder.append(plugin)
    stop = threading.Event()
    thread = threading.Thread(target=plugin.run, args=(stop,), daemon=True)
    thread.start()
    return plugin, stop, thread


@pytest.mark.parametrize(("version", "device", "reason", "words"), [
    ("v2.0.5", UUID_B, RefusalReason.RUNTIME_DROPS_CDI, "which containerd 2.0.5 drops without a word"),
    ("v2.4.2", UUID_A, RefusalReason.NO_CDI_SPEC, f"no CDI spec on this node names GPU {UUID_A}"),
], ids=["containerd-2.0", "no-cdi-spec"])
def test_the_plugin_refuses_a_fraction_that_would_get_no_working_gpu(tmp_path: Path, version: str, device: str,
                                                                     reason: RefusalReason, words: str) -> None:
    runtime = FakeRuntime(tmp_path / "nri.sock")
    sink = RecordingSink()
    nodes = {"/dev/nvidia0": DeviceNode("/dev/nvidia0", 195, 0)}
    plugin, stop, thread = plugin_with_runtime_facts(
        runtime, sink, lambda registered: replace(FACTS, device_nodes=nodes, delivery=DeliveryFacts(registered)))
    try:
        runtime.accept()
        handshake(runtime, version)
        answer = runtime.create(*fraction_pod("u1", device))
        assert answer.status.code == 9  # FailedPrecondition: containerd fails the creation with this message
        assert words in answer.status.message
        assert answer.status.message.startswith("container app of pod team-a/pod-u1: ")
        decided = sink.decisions[-1][1]
        assert isinstance(decided, Refusal) and decided.reason is reason
        if version == "v2.4.2":  # the GPU a spec names still gets its CDI device
            fine = runtime.create(*fraction_pod("u2", UUID_B))
            adjust = api_pb2.CreateContainerResponse.FromString(fine.payload).adjust
            assert fine.status.code == 0 and [d.name for d in adjust.CDI_devices] == [f"nvidia.com/gpu={UUID_B}"]
    finally:
        halt_plugin(plugin, stop, thread)
        runtime.close()
