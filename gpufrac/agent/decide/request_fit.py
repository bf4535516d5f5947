"""Whether a fraction's request fits on its GPUs next to the requests already owed there. Pure.

A fraction's request is guaranteed: what the fractions placed on a GPU request together must fit in its usable memory
(total less the driver's reserve and the MPS server's context: decide.capacity). A scheduler that reads the GPU's
total (KAI, from `nvidia.com/gpu.memory`) can place one request more than fits; reclaim cannot make room for it
(every request there is owed). So the NRI plugin refuses, at creation, a fraction whose request does not fit next to
the others' on one of its GPUs, with the numbers; the kubelet tries again, and it starts once room is made (a pod
gone). Owed are every fractional container bound to the node, from bind on, and the DRA claims prepared here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpufrac.agent.decide.model import GpuInfo, RunningContainer
from gpufrac.agent.decide.mps_limits import gpu_uuid


@dataclass(frozen=True)
class Owed:
    """One fraction's request on one GPU."""

    pod_uid: str
    container: str
    where: str  # `namespace/pod`, for the message
    request_mib: int


def owed_by_gpu(placed: Iterable[RunningContainer], gpus: Sequence[GpuInfo]) -> dict[str, tuple[Owed, ...]]:
    """GPU UUID -> the requests of the fractions placed on it."""
    found: dict[str, list[Owed]] = {}
    for c in placed:
        if not c.fraction.request_mib:
            continue
        for entry in c.fraction.devices:
            uuid = gpu_uuid(entry, gpus)
            if uuid is not None:
                found.setdefault(uuid, []).append(Owed(c.pod_uid, c.container, f"{c.namespace}/{c.pod}",
                                                       c.fraction.request_mib))
    return {uuid: tuple(owed) for uuid, owed in found.items()}


def does_not_fit(pod_uid: str, container: str, request_mib: int | None, gpus: Sequence[str],
                 usable_mib: Mapping[str, int], owed: Mapping[str, Sequence[Owed]]) -> str | None:
    """Why the request does not fit on one of `gpus` (None: it fits, or a GPU's usable memory is not measured yet)."""
    if not request_mib:
        return None
    for uuid in gpus:
        usable = usable_mib.get(uuid)
        if usable is None:
            continue
        others = [o for o in owed.get(uuid, ()) if (o.pod_uid, o.container) != (pod_uid, container)]
        taken = sum(o.request_mib for o in others)
        if taken + request_mib > usable:
            listed = ", ".join(f"{o.where} ({o.container}) {o.request_mib} MiB" for o in others) or "none"
            return (f"its request of {request_mib} MiB does not fit on GPU {uuid}: {usable} MiB usable there, "
                    f"{taken} MiB of it requested by the fractions placed there ({listed})")
    return None


def admitted(owed: Sequence[RunningContainer], gpus: Sequence[GpuInfo],
             usable_mib: Mapping[str, int]) -> list[RunningContainer]:
    """The owed containers the node lets run: one not created yet whose request does not fit next to the others' is
    refused at its creation (`does_not_fit`, as the NRI plugin decides it), so no memory can be owed to it and
    reclaim must not evict for it. A created container or a claim's share (prepared already) stays owed."""
    placed = owed_by_gpu(owed, gpus)
    return [c for c in owed if c.container_id or c.claim or does_not_fit(
        c.pod_uid, c.container, c.fraction.request_mib,
        [u for u in (gpu_uuid(d, gpus) for d in c.fraction.devices) if u is not None], usable_mib, placed) is None]
