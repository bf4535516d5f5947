"""A lost GPU in the DRA driver's slices: the fake NVML delivers a critical XID to the agent's event set (as the real
driver does, testkit/fakes/fake_nvml.c), the GPU's devices are tainted at the next publishing and untainted once the
GPU is back (NVML stopped listing it, then lists it again: a reset)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from e2e.toolkit.wait import wait_until
from gpufrac.agent.decide.model import GpuInfo
from gpufrac.agent.dra.decide.gpu_health import GpuHealth, after_inventory, after_xid
from gpufrac.agent.dra.decide.prepare import DraNode
from gpufrac.agent.dra.decide.slices import SliceGpu, resource_slices
from gpufrac.agent.dra.health_watch import GpuHealthWatch
from gpufrac.agent.edges.nvml import NvmlSource
from testkit.agent import UUID_A, UUID_B
from testkit.fakes.state import FakeGpuState


def test_a_critical_xid_loses_the_gpu_an_applications_own_does_not_and_a_reset_brings_it_back() -> None:
    health = after_xid(GpuHealth(), UUID_A, 13)  # the application's own error (NVIDIA's device plugin skips it)
    assert health.lost == {}
    health = after_xid(health, UUID_A, 79)
    assert health.lost == {UUID_A: "XID 79"}
    assert after_inventory(health, [UUID_A, UUID_B]).lost == {UUID_A: "XID 79"}  # still listed: still lost
    gone = after_inventory(health, [UUID_B])
    assert gone.lost == {UUID_A: "XID 79"} and gone.gone == {UUID_A}
    assert after_inventory(gone, [UUID_A, UUID_B]) == GpuHealth()


@pytest.fixture
def watch(fake_gpus: FakeGpuState) -> Iterator[GpuHealthWatch]:
    fake_gpus.gpu(UUID_A).gpu(UUID_B)
    nvml = NvmlSource()

    def listed() -> tuple[str, ...]:
        return tuple(sorted(gpu.uuid for gpu in nvml.inventory().gpus))

    health = GpuHealthWatch(listed, wait_ms=100)
    health.start()
    yield health
    health.stop()


def slices_taints(lost: dict[str, str]) -> dict[str, object]:
    gpus = [SliceGpu(GpuInfo(i, uuid, "NVIDIA H200", 141 << 30), 141 << 30) for i, uuid in enumerate((UUID_A, UUID_B))]
    node = DraNode("node-a", {g.gpu.index: g for g in gpus}, "/run/gpufrac/mps", frozenset(), frozenset(),
                   frozenset(), lost=lost)
    by_index = {g.gpu.index: node.lost[g.gpu.uuid] for g in node.publishable() if g.gpu.uuid in node.lost}
    _, devices = resource_slices("node-a", node.publishable(), "615.20", 1, lost=by_index)
    return {d["name"]: d.get("taints") for d in devices["spec"]["devices"]}


def test_an_xid_from_nvml_taints_the_gpus_devices_and_its_return_untaints_them(
        fake_gpus: FakeGpuState, watch: GpuHealthWatch) -> None:
    assert watch.lost() == {}
    wait_until(lambda: watch.xids.watching == (UUID_A, UUID_B), timeout=10, what="the GPUs registered")
    fake_gpus.xid_error(UUID_B, 79)
    lost = wait_until(watch.lost, timeout=10, what="the XID delivered")
    assert lost == {UUID_B: "XID 79"}
    taints = slices_taints(lost)
    assert taints["gpu-1-time-slicing"] == taints["gpu-1"] == [
        {"key": "gpu.gpufrac.io/unhealthy", "value": "XID 79", "effect": "NoSchedule"}]
    assert taints["gpu-0"] is None
    # the GPU falls off the bus, and comes back after a reset: healthy again
    fake_gpus.state["gpus"] = [g for g in fake_gpus.state["gpus"] if g["uuid"] != UUID_B]
    fake_gpus.write()
    assert watch.lost() == {UUID_B: "XID 79"}
    wait_until(lambda: watch.xids.watching == (UUID_A,), timeout=10, what="the GPU gone from the registration")
    fake_gpus.gpu(UUID_B)
    assert watch.lost() == {}
    assert not any(slices_taints({}).values())
    wait_until(lambda: watch.xids.watching == (UUID_A, UUID_B), timeout=10, what="the GPUs registered again")
    fake_gpus.xid_error(UUID_B, 48)  # the new registration sees a later XID
    assert wait_until(watch.lost, timeout=10, what="the XID after the reset") == {UUID_B: "XID 48"}
