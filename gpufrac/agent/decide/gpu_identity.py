"""Which GPU a device entry names, whatever its spelling (`1`, `GPU-a`, `nvidia.com/gpu=1`): the NRI plugin's
grants and the DRA driver's claims both read their GPUs through it."""

from __future__ import annotations

from collections.abc import Iterable

from gpufrac.agent.decide.model import GpuInfo
from gpufrac.core.annotations import device_id


def gpu_identity(entry: str, gpus: Iterable[GpuInfo]) -> str:
    """The GPU a gpus.devices entry names, as one string whatever its spelling: the UUID where NVML knows it
    (`1`, `GPU-a`, `nvidia.com/gpu=1` are the same GPU), else the entry's id."""
    identifier = device_id(entry)
    gpu = gpu_named(identifier, gpus)
    return gpu.uuid if gpu is not None else identifier


def gpu_named(identifier: str, gpus: Iterable[GpuInfo]) -> GpuInfo | None:
    """The GPU whose UUID or index is `identifier` (None: NVML knows none)."""
    return next((g for g in gpus if identifier in (g.uuid, str(g.index))), None)
