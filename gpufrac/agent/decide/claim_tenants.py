"""The DRA driver's prepared claims as the tenants of the node's GPUs, alike to an annotated pod's fractional
containers for all that holds a fraction: the sm-sharing daemon's own limits, the audit (limit env, container
totals, devices, modes), the usage metrics and reclaim. Pure.

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

from gpufrac.agent.decide.dra_prepare import PreparedClaim, PreparedDevice
from gpufrac.agent.decide.dra_slices import WHOLE
from gpufrac.agent.decide.model import RunningContainer
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import CanonicalFraction, LimitEnv


@dataclass(frozen=True)
class ClaimTenants:
    """The prepared shares, and which of them a process is by its pod and GPU."""

    tenants: tuple[RunningContainer, ...] = ()
    by_pod_gpu: Mapping[tuple[str, str], RunningContainer] = field(default_factory=dict)  # (pod UID, GPU UUID)
    pod_uids: frozenset[str] = frozenset()  # every pod a claim is reserved for (the audit asks per process)


NO_CLAIMS = ClaimTenants()


def _tenant(claim: PreparedClaim, device: PreparedDevice) -> RunningContainer:
    name = f"{claim.claim.name}/{device.request}"
    mode = ComputeMode(device.mode)
    pinned = any(entry.startswith(f"{LimitEnv.PINNED_MEM_LIMIT}=") for entry in device.env)
    fraction = CanonicalFraction(
        name, mode, device.request_mib, device.limit_mib,
        pinned_mem_limit_mib={device.gpu_index: device.limit_mib} if pinned else {},
        devices=(device.gpu_uuid,),
        active_thread_percent=device.compute_percent if mode is ComputeMode.SM_SHARING else None,
    )
    pod_name, pod_uid = (claim.pods[0].name, claim.pods[0].uid) if claim.pods else (claim.claim.name,
                                                                                      claim.claim.uid)
    # A share recorded without its env (before the agent kept it) has () here: nothing of its env is checked.
    return RunningContainer(claim.claim.namespace, pod_name, pod_uid, name, "", fraction, claim=name,
                            written_env=device.env)


def claim_tenants(claims: Iterable[PreparedClaim]) -> ClaimTenants:
    tenants: list[RunningContainer] = []
    by_pod_gpu: dict[tuple[str, str], RunningContainer] = {}
    for claim in claims:
        for device in claim.devices:
            if device.mode == WHOLE or device.admin:  # admin access: a view of the GPU, owing nothing
                continue
            tenant = _tenant(claim, device)
            tenants.append(tenant)
            for pod in claim.pods:
                by_pod_gpu[(pod.uid, device.gpu_uuid)] = tenant
    pod_uids = frozenset(uid for uid, _ in by_pod_gpu) | frozenset(t.pod_uid for t in tenants)
    return ClaimTenants(tuple(tenants), by_pod_gpu, pod_uids)
