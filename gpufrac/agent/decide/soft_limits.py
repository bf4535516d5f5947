"""Who takes back GPU memory used above a request on this node: the driver, or the agent's eviction. Pure.

With MPS v3 memory partitioning (r615+ with CUDA 13.4) and the cgroup v2 `dmem` controller, NVIDIA's toolkit hook
makes a container's `NVIDIA_GPU_MEMORY_REQUEST` (the webhook's request) a soft limit (`dmem.min`) and its
`NVIDIA_GPU_MEMORY_LIMIT` a hard one (`dmem.max`): under contention the driver itself takes memory back from a
client above its soft limit, killing it if it must, with no grace. Two reclaimers would race, and the driver acts
first, so there the agent evicts nothing for reclaim (it still measures and reports the shortfall). Elsewhere (an
older driver, cgroup v1, no `dmem`) the agent's eviction, `reclaim.policy`, is what holds the requests.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from gpufrac.agent.decide.attribution import AttributedProcess
from gpufrac.agent.decide.capabilities import has_driver_memory_limits
from gpufrac.agent.decide.model import GpuProcess, Inventory
from gpufrac.agent.decide.reclaim import GpuShare, ReclaimPolicy, Tenant

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


@dataclass(frozen=True)
class AboveRequest:
    """A process of a tenant that used more than its request on a GPU, as one pass saw it."""

    pid: int
    gpu_uuid: str
    tenant: Tenant


def above_request(shares: Iterable[GpuShare], attributed: Iterable[AttributedProcess]) -> dict[tuple[int, str],
                                                                                                AboveRequest]:
    """By (PID, GPU): the processes of the tenants above their requests."""
    over = {(t.container.key, share.gpu_uuid): t for share in shares for t in share.tenants
            if t.above_request_bytes > 0}
    found = {}
    for item in attributed:
        tenant = over.get((item.container.key, item.process.gpu_uuid))
        if tenant is not None:
            found[(item.process.pid, item.process.gpu_uuid)] = AboveRequest(item.process.pid, item.process.gpu_uuid,
                                                                            tenant)
    return found


def ended(before: Mapping[tuple[int, str], AboveRequest], processes: Iterable[GpuProcess]) -> list[AboveRequest]:
    """The processes above their requests at the last pass that NVML no longer lists: where the driver holds the
    requests as soft limits it kills such a process, with no grace and no word of its own, when a neighbour needs
    the memory (it may also have ended by itself: the Event says both)."""
    listed = {(p.pid, p.gpu_uuid) for p in processes}
    return [b for key, b in sorted(before.items()) if key not in listed]
