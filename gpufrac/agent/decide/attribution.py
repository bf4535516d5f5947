"""Which fractional container (or DRA claim's share) each GPU process belongs to, by its cgroup. Pure.

A process is a container's when its cgroup names that container's ID, else a claim's share when its cgroup names a
pod the claim is reserved for and it uses the claim's GPU; any other process (of no fraction, or whose cgroup was not
read) is no one's here. What reclaim makes of the memory no one is charged for: `reclaim.shares`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpufrac.agent.decide.claim_tenants import NO_CLAIMS, ClaimTenants
from gpufrac.agent.decide.model import GpuProcess, RunningContainer
from gpufrac.agent.decide.proc_text import container_ids_in_cgroup, pod_uids_in_cgroup


def in_fractional_container(cgroup: str, containers: Mapping[str, RunningContainer],
                            claims: ClaimTenants = NO_CLAIMS) -> bool:
    """Whether a process' cgroup names one of the fractional containers, or a pod a claim is reserved for (only
    those get their environ read)."""
    return any(c in containers for c in container_ids_in_cgroup(cgroup)) or \
        bool(claims.by_pod_gpu and pod_uids_in_cgroup(cgroup) & claims.pod_uids)


@dataclass(frozen=True)
class AttributedProcess:
    process: GpuProcess
    container: RunningContainer
    environ: Mapping[str, str] | None  # None: could not be read (the process exited meanwhile)


def attribute(
    processes: Iterable[GpuProcess],
    containers: Mapping[str, RunningContainer],
    cgroups: Mapping[int, str],
    environs: Mapping[int, Mapping[str, str]],
    claims: ClaimTenants = NO_CLAIMS,
) -> list[AttributedProcess]:
    """Match processes to fractional containers by the container ID in their cgroup, else to a claim's share by
    the pod UID in their cgroup and the GPU they use; others are dropped."""
    result = []
    for process in processes:
        text = cgroups.get(process.pid)
        if text is None:
            continue
        container = _owner(text, process.gpu_uuid, containers, claims)
        if container is not None:
            result.append(AttributedProcess(process, container, environs.get(process.pid)))
    return result


def _owner(cgroup: str, gpu_uuid: str, containers: Mapping[str, RunningContainer],
           claims: ClaimTenants) -> RunningContainer | None:
    for container_id in container_ids_in_cgroup(cgroup):
        if container_id in containers:
            return containers[container_id]
    if not claims.by_pod_gpu:
        return None
    return next((claims.by_pod_gpu[(uid, gpu_uuid)] for uid in sorted(pod_uids_in_cgroup(cgroup))
                 if (uid, gpu_uuid) in claims.by_pod_gpu), None)
