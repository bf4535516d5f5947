"""A ResourceClaim (resource.k8s.io/v1) as the DRA driver reads it: its allocation's results for this driver and
the opaque config addressed to it. Pure: the API object in, typed values or a one-line error out.

The opaque config (optional, in the claim or its DeviceClass) gives a memory limit above the request:
  {"apiVersion": "gpu.gpufrac.io/v1alpha1", "kind": "GpuConfig", "memoryLimit": "48Gi"}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufrac.agent.dra.decide.slices import DRIVER
from gpufrac.core.contract import mib_ceil
from gpufrac.core.quantity import QuantityError, parse_quantity

CONFIG_API_VERSION = "gpu.gpufrac.io/v1alpha1"
CONFIG_KIND = "GpuConfig"
_CONFIG_KEYS = frozenset({"apiVersion", "kind", "memoryLimit"})


class ClaimError(ValueError):
    """A claim this driver cannot prepare; the message says why in one line."""


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True)
class ClaimPod:
    """A pod the claim is reserved for (its `status.reservedFor`): whose processes use the claim's share."""

    name: str
    uid: str


@dataclass(frozen=True)
class AllocatedDevice:
    """One result of the claim's allocation for this driver."""

    request: str
    pool: str
    device: str
    consumed: Mapping[str, str] = field(default_factory=dict)  # consumedCapacity: capacity name -> quantity
    share_id: str | None = None
    admin: bool = False  # adminAccess (GA in 1.36): a monitoring view of a device others may hold, owing nothing


@dataclass(frozen=True)
class ClaimAllocation:
    claim: ClaimRef
    devices: tuple[AllocatedDevice, ...]
    limit_mib: Mapping[str, int]  # request name -> memory limit (MiB) from the opaque config; "" = every request
    pods: tuple[ClaimPod, ...] = ()


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ClaimError(f"{where} is not an object")
    return value


def _strings(value: Any, where: str) -> Mapping[str, str]:
    found = _mapping(value, where)
    if not all(isinstance(v, (str, int)) for v in found.values()):
        raise ClaimError(f"{where} holds a value that is not a quantity")
    return {str(k): str(v) for k, v in found.items()}


def quantity_mib(text: str, where: str) -> int:
    """A memory quantity in whole MiB, rounded up (a limit is never tightened)."""
    try:
        value = parse_quantity(text)
    except QuantityError as err:
        raise ClaimError(f"{where}: {text!r} is not a Kubernetes quantity") from err
    return mib_ceil(value)


def _result(result: Any) -> AllocatedDevice | None:
    entry = _mapping(result, "an allocation result")
    if entry.get("driver") != DRIVER:
        return None
    share = entry.get("shareID")
    return AllocatedDevice(request=str(entry.get("request", "")), pool=str(entry.get("pool", "")),
                           device=str(entry.get("device", "")),
                           consumed=_strings(entry.get("consumedCapacity"), "consumedCapacity"),
                           share_id=str(share) if share else None, admin=entry.get("adminAccess") is True)


def _config_limit(parameters: Any) -> int:
    params = _mapping(parameters, f"the opaque config of driver {DRIVER}")
    if params.get("apiVersion") != CONFIG_API_VERSION or params.get("kind") != CONFIG_KIND:
        raise ClaimError(f"the opaque config of driver {DRIVER} must be apiVersion {CONFIG_API_VERSION}, "
                         f"kind {CONFIG_KIND}; got {params.get('apiVersion')!r}, {params.get('kind')!r}")
    unknown = sorted(set(params) - _CONFIG_KEYS)
    if unknown:
        raise ClaimError(f"the opaque config of driver {DRIVER} has unknown fields {unknown}; it takes memoryLimit")
    limit = params.get("memoryLimit")
    if not isinstance(limit, str):
        raise ClaimError(f"the opaque config of driver {DRIVER} needs memoryLimit, a quantity such as \"48Gi\"")
    return quantity_mib(limit, "memoryLimit")


def _limits(configs: Any) -> dict[str, int]:
    """The memory limit per request; the claim's config wins over its class'."""
    limits: dict[str, int] = {}
    entries = [_mapping(raw, "an allocation config") for raw in configs or ()]
    for config in sorted(entries, key=lambda c: c.get("source") == "FromClaim"):  # the claim's own last: it wins
        opaque = _mapping(config.get("opaque"), "an opaque config")
        if opaque.get("driver") != DRIVER:
            continue
        limit = _config_limit(opaque.get("parameters"))
        for request in config.get("requests") or [""]:
            limits[str(request)] = limit
    return limits


def read_claim(obj: Mapping[str, Any]) -> ClaimAllocation:
    """The claim's allocation for this driver; ClaimError when it has none or it does not read."""
    meta = _mapping(obj.get("metadata"), "metadata")
    claim = ClaimRef(str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", "")))
    allocation = _mapping(_mapping(obj.get("status"), "status").get("allocation"), "status.allocation")
    if not allocation:
        raise ClaimError(f"claim {claim} is not allocated")
    devices = _mapping(allocation.get("devices"), "status.allocation.devices")
    ours = tuple(d for d in map(_result, devices.get("results") or ()) if d is not None)
    if not ours:
        raise ClaimError(f"claim {claim} has no device of driver {DRIVER}")
    return ClaimAllocation(claim, ours, _limits(devices.get("config")), reserved_pods(obj))


def reserved_pods(obj: Mapping[str, Any]) -> tuple[ClaimPod, ...]:
    """The pods the claim is reserved for (`status.reservedFor`); other consumers (none are defined for pods' GPUs)
    are left out."""
    status = obj.get("status")
    reserved = status.get("reservedFor") if isinstance(status, Mapping) else None
    if not isinstance(reserved, list):
        return ()
    pods = {ClaimPod(str(r["name"]), str(r["uid"])) for r in reserved
            if isinstance(r, Mapping) and r.get("resource") == "pods" and not r.get("apiGroup")
            and r.get("name") and r.get("uid")}
    return tuple(sorted(pods, key=lambda p: (p.name, p.uid)))


def limit_for(allocation: ClaimAllocation, request: str) -> int | None:
    """The opaque config's limit for a request (a subrequest `req/sub` takes its parent's too)."""
    for name in (request, request.split("/", 1)[0], ""):
        if name in allocation.limit_mib:
            return allocation.limit_mib[name]
    return None
