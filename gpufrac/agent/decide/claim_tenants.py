"""A front door's placed claims (the DRA driver's prepared ones: dra.decide.tenants) as the tenants of the node's
GPUs, alike to an annotated pod's fractional containers for all that holds a fraction: the sm-sharing daemon's own
limits, the audit (limit env, container totals, devices, modes), the usage metrics and reclaim. Pure.

A claim's share of a GPU is one tenant. Its request is owed from Prepare on (the kubelet prepares a claim before it
creates the pod's containers, and unprepares it when they are gone), and its limit caps what its processes use on
its GPU together. A claim may serve several containers and the driver is not told which, so its processes are those
whose cgroup names a pod the claim is reserved for (`status.reservedFor`, recorded at Prepare), on the claim's GPU.
The tenant is named `<claim>/<request>` (its `container`) and after the first of those pods, which an Event names
and an eviction evicts. Whole GPUs are not shares: nothing on them is owed to anyone else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpufrac.agent.decide.model import RunningContainer


@dataclass(frozen=True)
class ClaimTenants:
    """The prepared shares, and which of them a process is by its pod and GPU."""

    tenants: tuple[RunningContainer, ...] = ()
    by_pod_gpu: Mapping[tuple[str, str], RunningContainer] = field(default_factory=dict)  # (pod UID, GPU UUID)
    pod_uids: frozenset[str] = frozenset()  # every pod a claim is reserved for (the audit asks per process)


NO_CLAIMS = ClaimTenants()


def joined(found: Iterable[ClaimTenants]) -> ClaimTenants:
    """The tenants of several doors as one."""
    parts = [part for part in found if part is not NO_CLAIMS]
    if len(parts) <= 1:
        return parts[0] if parts else NO_CLAIMS
    return ClaimTenants(tuple(t for part in parts for t in part.tenants),
                        {key: t for part in parts for key, t in part.by_pod_gpu.items()},
                        frozenset(uid for part in parts for uid in part.pod_uids))
