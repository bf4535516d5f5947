"""A node whose driver predates r615 (the fake NVML says 580.x): with the default modes the agent keeps the condition
KAI reads True, since sm-sharing is enforced by MPS's pinned limits, and says that time-slicing is not, in its
condition, its labels and its refusals. End to end in one process: real pynvml over the fake libnvidia-ml.so.1."""

from __future__ import annotations

import pytest

from e2e.toolkit.wait import wait_until
from gpufrac.agent.csi.service import node_dirs
from gpufrac.agent.nri.decide.creation import (
    ContainerInfo,
    Injection,
    NodeFacts,
    PodInfo,
    Refusal,
    RefusalReason,
    decide,
)
from gpufrac.core.annotations import ComputeMode
from testkit.agent import UUID_A, UUID_B, FakeNode, canonical_annotations, container, gpu_info, injected_env, value

KAI_TYPES = ("gpu-sharing.nvidia.com/Ready", "gpu-fractioning.nvidia.com/Ready")
TS, SM = ComputeMode.TIME_SLICING, ComputeMode.SM_SHARING


@pytest.fixture
def world(fake_node: FakeNode) -> FakeNode:
    fake_node.gpus.set(driver_version="580.95.05", cuda_driver_version=13000)
    return fake_node


def fraction(mode: ComputeMode) -> tuple[PodInfo, ContainerInfo]:
    annotations = canonical_annotations("app", request_mib=2048, limit_mib=4096, devices=[UUID_B], mode=str(mode))
    env = injected_env(container("app", mode=mode, request_mib=2048, limit_mib=4096, devices=(UUID_B,)))
    return PodInfo("team-a", f"infer-{mode}", f"u-{mode}", annotations), ContainerInfo("c1", "app", env)


def test_580_keeps_kais_condition_true_and_says_which_modes_are_enforced(world: FakeNode) -> None:
    agent = world.start_agent()
    agent.tick()
    wait_until(lambda: agent.daemon_statuses()[SM].up)
    agent.tick()
    labels = world.kube.labels
    assert (labels["gpufrac.io/enforcement.sm-sharing"], labels["gpufrac.io/enforcement.time-slicing"],
            labels["gpufrac.io/driver-version.major"]) == ("mps", "none", "580")
    own = world.kube.last_condition()
    assert (own["status"], own["reason"]) == ("True", "DriverWithoutMemoryLimits")
    assert own["message"].startswith("GPU memory fractions are enforced (sm-sharing: mps) on 2 GPU(s); "
                                     "not time-slicing: driver 580.95.05 (CUDA 13.0) has no CUDA 13.4 memory limits")
    for kai_type in KAI_TYPES:
        kai = world.kube.last_condition(kai_type)
        assert (kai["status"], kai["reason"], kai["message"]) == ("True", own["reason"], own["message"]), kai_type
    assert value(agent.metrics, "gpufrac_node_enforcement", mode="sm-sharing", enforcement="mps") == 1
    assert value(agent.metrics, "gpufrac_node_enforcement", mode="time-slicing", enforcement="none") == 1

    # what the NRI plugin is told (NriService.facts): sm-sharing served, time-slicing refused with the reason
    not_served = node_dirs(agent).not_served
    assert not_served[SM] is None
    assert "driver 580.95.05 has no CUDA 13.4 memory limits" in (not_served[TS] or "")
    facts = NodeFacts((gpu_info(0, UUID_A), gpu_info(1, UUID_B)), frozenset({f"nvidia.com/gpu={UUID_B}"}), {},
                      dict(not_served))
    refused = decide(*fraction(TS), facts)
    assert isinstance(refused, Refusal) and refused.reason is RefusalReason.MODE_NOT_ENFORCED
    assert "time-slicing GPU fraction, which this node does not enforce now: driver 580.95.05" in refused.message
    admitted = decide(*fraction(SM), facts)
    assert isinstance(admitted, Injection) and admitted.cdi_devices == (f"nvidia.com/gpu={UUID_B}",)


def test_580_with_time_slicing_alone_is_not_ready(world: FakeNode) -> None:
    agent = world.start_agent(modes=(TS,))
    agent.tick()
    own = world.kube.last_condition()
    assert (own["status"], own["reason"]) == ("False", "DriverWithoutMemoryLimits")
    assert world.kube.last_condition(KAI_TYPES[0])["status"] == "False"
    assert agent.daemon_statuses() == {}
