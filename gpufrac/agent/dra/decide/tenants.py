"""The DRA driver's prepared claims as the tenants of the node's GPUs (decide.claim_tenants says what a tenant is to
the node core). Pure."""

from __future__ import annotations

from collections.abc import Iterable

from gpufrac.agent.decide.claim_tenants import ClaimTenants
from gpufrac.agent.decide.model import RunningContainer
from gpufrac.agent.dra.decide.prepare import PreparedClaim, PreparedDevice
from gpufrac.agent.dra.decide.slices import WHOLE
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import CanonicalFraction, LimitEnv


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
