"""Who takes back GPU memory used above a request on this node: the driver, or the agent's eviction. Pure.

With MPS v3 memory partitioning (r615+ with CUDA 13.4) and the cgroup v2 `dmem` controller, NVIDIA's toolkit hook
makes a container's `NVIDIA_GPU_MEMORY_REQUEST` (the webhook's request) a soft limit (`dmem.min`) and its
`NVIDIA_GPU_MEMORY_LIMIT` a hard one (`dmem.max`): under contention the driver itself takes memory back from a
client above its soft limit, killing it if it must, with no grace. Two reclaimers would race, and the driver acts
first, so there the agent evicts nothing for reclaim (it still measures and reports the shortfall). Elsewhere (an
older driver, cgroup v1, no `dmem`) the agent's eviction, `reclaim.policy`, is what holds the requests.
"""

from __future__ import annotations

from collections.abc import Collection
from enum import StrEnum

from gpufrac.agent.decide.capabilities import has_driver_memory_limits
from gpufrac.agent.decide.model import Inventory
from gpufrac.agent.decide.reclaim import ReclaimPolicy

DMEM_CONTROLLER = "dmem"  # the cgroup v2 controller the driver's soft and hard limits live in


class ReclaimBy(StrEnum):
    DRIVER = "driver"  # soft limit = request, hard limit = limit, in each container's dmem cgroup
    AGENT = "agent"  # the agent's eviction (reclaim.policy), after the window


def reclaim_by(inventory: Inventory | None, cgroup_controllers: Collection[str]) -> ReclaimBy:
    """The driver where it holds requests as soft limits (its memory limits and the dmem controller), else the agent."""
    if inventory is not None and has_driver_memory_limits(inventory) and DMEM_CONTROLLER in cgroup_controllers:
        return ReclaimBy.DRIVER
    return ReclaimBy.AGENT


def reclaim_note(by: ReclaimBy, policy: ReclaimPolicy) -> str:
    """For the node's condition: which of the two holds each request."""
    if by is ReclaimBy.DRIVER:
        return ("memory above a request is taken back by the driver (MPS v3 memory partitioning with the cgroup dmem "
                "controller: each request a soft limit, each limit a hard one), not by the agent's eviction")
    without = ("this node's driver holds no soft limits (that needs r615+ with CUDA 13.4 and the cgroup v2 dmem "
               "controller)")
    if policy is ReclaimPolicy.EVICT:
        return f"memory above a request is taken back by the agent's eviction (reclaim.policy evict): {without}"
    return f"memory above a request is not taken back (reclaim.policy off), and {without}"
