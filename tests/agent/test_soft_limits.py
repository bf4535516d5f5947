"""Issue 31: who takes back GPU memory above a request, the driver (MPS v3 memory partitioning with the cgroup dmem
controller: requests are soft limits) or the agent's eviction, and the node's condition saying which
(gpufrac.agent.decide.soft_limits)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufrac.agent.decide import capabilities
from gpufrac.agent.decide.model import DaemonState, DaemonStatus, Inventory
from gpufrac.agent.decide.reclaim import ReclaimPolicy
from gpufrac.agent.decide.soft_limits import ReclaimBy, reclaim_by, reclaim_note
from gpufrac.agent.edges.procfs import read_cgroup_controllers
from gpufrac.core.annotations import ComputeMode
from testkit.agent import gpu_info

V2_WITH_DMEM = frozenset({"cpu", "memory", "pids", "dmem"})


def inventory(driver: str, cuda: int) -> Inventory:
    return Inventory(driver, cuda, (gpu_info(0, "GPU-00000000-0000-0000-0000-000000000000"),))


@pytest.mark.parametrize(("node", "controllers", "by"), [
    (inventory("615.20", 13040), V2_WITH_DMEM, ReclaimBy.DRIVER),
    (inventory("615.20", 13040), V2_WITH_DMEM - {"dmem"}, ReclaimBy.AGENT),  # cgroup v2 without dmem
    (inventory("615.20", 13040), frozenset(), ReclaimBy.AGENT),  # cgroup v1: no cgroup.controllers
    (inventory("580.95.05", 13000), V2_WITH_DMEM, ReclaimBy.AGENT),  # no MPS v3 memory partitioning
    (inventory("615.20", 13000), V2_WITH_DMEM, ReclaimBy.AGENT),  # r615 with CUDA 13.0: no 13.4 limits
    (None, V2_WITH_DMEM, ReclaimBy.AGENT),  # NVML not read
])
def test_the_driver_takes_memory_back_only_with_its_limits_and_the_dmem_controller(node, controllers, by):
    assert reclaim_by(node, controllers) is by


def test_the_condition_says_who_holds_the_requests():
    node = inventory("615.20", 13040)
    daemons = {m: DaemonStatus(m, DaemonState.RUNNING, True, 0) for m in ComputeMode}
    enforced = capabilities.enforcement(node, tuple(ComputeMode), daemons)
    without = ("this node's driver holds no soft limits (that needs r615+ with CUDA 13.4 and the cgroup v2 dmem "
               "controller)")
    for by, policy, said in [
        (ReclaimBy.DRIVER, ReclaimPolicy.EVICT, "memory above a request is taken back by the driver (MPS v3 memory "
                                                "partitioning with the cgroup dmem controller: each request a soft "
                                                "limit, each limit a hard one), not by the agent's eviction"),
        (ReclaimBy.AGENT, ReclaimPolicy.EVICT, "memory above a request is taken back by the agent's eviction "
                                               f"(reclaim.policy evict): {without}"),
        (ReclaimBy.AGENT, ReclaimPolicy.OFF, f"memory above a request is not taken back (reclaim.policy off), and "
                                             f"{without}"),
    ]:
        assert reclaim_note(by, policy) == said
        condition = capabilities.node_condition(node, tuple(ComputeMode), enforced, daemons, reclaim=said)
        assert condition.status == "True" and condition.message.endswith(f"; {said}")


def test_the_controllers_read_from_the_agents_cgroup(tmp_path: Path):
    path = tmp_path / "cgroup.controllers"
    assert read_cgroup_controllers(path) == frozenset()  # cgroup v1: no such file
    path.write_text("cpuset cpu io memory dmem\n")
    assert read_cgroup_controllers(path) == frozenset({"cpuset", "cpu", "io", "memory", "dmem"})
