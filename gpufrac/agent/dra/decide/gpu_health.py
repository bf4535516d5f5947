"""Which of the node's GPUs are lost, for the DRA driver's slices (their devices tainted) and Prepare. Pure.

A critical XID error marks the GPU unhealthy, as NVIDIA's device plugin and DRA driver mark theirs, except the XIDs
NVIDIA's device plugin skips as the application's own errors (k8s-device-plugin, internal/rm/health.go). A GPU
comes back when NVML, having stopped listing it (fallen off the bus, being reset), lists it again: the reset is
what clears an XID's state in the driver.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})  # NVIDIA's device plugin ignores these by default


@dataclass(frozen=True)
class GpuHealth:
    lost: Mapping[str, str] = field(default_factory=dict)  # GPU UUID -> why (the XID)
    gone: frozenset[str] = frozenset()  # of those, the ones NVML does not list now


def after_xid(health: GpuHealth, uuid: str, xid: int) -> GpuHealth:
    if xid in APPLICATION_XIDS or uuid in health.lost:
        return health
    return GpuHealth({**health.lost, uuid: f"XID {xid}"}, health.gone)


def after_inventory(health: GpuHealth, listed: Collection[str]) -> GpuHealth:
    """A lost GPU that NVML stops listing is gone; listed again after that, it is back and healthy."""
    lost = {uuid: why for uuid, why in health.lost.items() if not (uuid in health.gone and uuid in listed)}
    gone = frozenset(uuid for uuid in lost if uuid not in listed)
    if lost == health.lost and gone == health.gone:
        return health
    return GpuHealth(lost, gone)
