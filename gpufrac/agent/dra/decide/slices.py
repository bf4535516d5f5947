"""What the DRA driver `gpu.gpufrac.io` publishes about a node: its ResourceSlices (resource.k8s.io/v1). Pure.

Per GPU, three devices the standard scheduler allocates from:
  gpu-<i>-time-slicing   multi-allocatable, `memory` capacity (the GPU's usable memory, requested in steps of 1 MiB)
  gpu-<i>-sm-sharing     multi-allocatable, `memory` and `compute` (percent of the GPU's SM threads) capacity
  gpu-<i>                the whole GPU, for one claim
All three consume the same 1-unit counter of the GPU's counter set `gpu-<i>`. The allocator charges a
multi-allocatable device's counters once, for its first share, so while a time-slicing share holds the counter no
sm-sharing share or whole GPU fits: a GPU serves one mode at a time (Kubernetes 1.36 has no shared consumable
capacity nor compatibility groups to say it otherwise). Partitionable devices keep their counter sets in a slice
of their own, so a node's pool is two slices.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufrac.agent.decide.claim_holders import DRA_DRIVER
from gpufrac.agent.decide.model import GpuInfo
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import mib_floor

DRIVER = DRA_DRIVER
API_VERSION = "resource.k8s.io/v1"
WHOLE = "whole"  # the mode attribute of a whole-GPU device
MODES = (str(ComputeMode.TIME_SLICING), str(ComputeMode.SM_SHARING), WHOLE)
OWNER_COUNTER = "owner"  # 1 per GPU: who holds it decides the GPU's mode
MEMORY = "memory"
COMPUTE = "compute"
MODE_ATTRIBUTE = "mode"
SLICE_COUNT = 2  # the counter sets' slice and the devices' slice
# The taint a lost GPU's devices carry (resource.k8s.io/v1 DeviceTaint): NoSchedule keeps new claims off it, and
# NVIDIA's driver taints an unhealthy GPU's devices alike; the taint goes when the GPU is back.
LOST_TAINT_KEY = f"{DRIVER}/unhealthy"
CAPACITIES = {str(ComputeMode.TIME_SLICING): (MEMORY,), str(ComputeMode.SM_SHARING): (MEMORY, COMPUTE),
              WHOLE: (MEMORY,)}  # what each mode's device publishes, and so what a claim may consume of it


@dataclass(frozen=True)
class SliceGpu:
    """One GPU as the slice shows it: what NVML says and how much of its memory a workload can have."""

    gpu: GpuInfo
    usable_bytes: int

    @property
    def usable_mib(self) -> int:
        return mib_floor(self.usable_bytes)


@dataclass(frozen=True)
class DeviceName:
    """A published device's name read back: which GPU and which mode (`WHOLE` for the whole GPU)."""

    index: int
    mode: str


def device_name(index: int, mode: str) -> str:
    return f"gpu-{index}" if mode == WHOLE else f"gpu-{index}-{mode}"


def counter_set(index: int) -> str:
    return f"gpu-{index}"


def parse_device_name(name: str) -> DeviceName | None:
    """`gpu-0-sm-sharing` → (0, sm-sharing), `gpu-3` → (3, whole); None for a name this driver never publishes."""
    head, _, rest = name.partition("-")
    index_text, _, mode = rest.partition("-")
    if head != "gpu" or not index_text.isdigit() or str(int(index_text)) != index_text:
        return None
    mode = mode or WHOLE
    if mode not in MODES or (mode == WHOLE and "-" in rest):
        return None
    return DeviceName(int(index_text), mode)


def pool_name(node: str) -> str:
    """One pool per node, named after it (as NVIDIA's driver does)."""
    return node


def slice_names(node: str) -> tuple[str, str]:
    """The counters' slice and the devices' slice of a node (object names, unique per driver and node)."""
    return f"{node}-gpufrac-counters", f"{node}-gpufrac-devices"


def _memory_capacity(mib: int) -> dict[str, Any]:
    # No request takes all of it (a claim without a memory request has the GPU's memory to itself).
    return {"value": f"{mib}Mi",
            "requestPolicy": {"default": f"{mib}Mi", "validRange": {"min": "1Mi", "max": f"{mib}Mi", "step": "1Mi"}}}


def _compute_capacity() -> dict[str, Any]:
    return {"value": "100", "requestPolicy": {"default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}}}


def _device(gpu: SliceGpu, mode: str, driver_version: str, lost: str | None) -> dict[str, Any]:
    capacity: dict[str, Any] = {MEMORY: {"value": f"{gpu.usable_mib}Mi"}}
    device: dict[str, Any] = {"name": device_name(gpu.gpu.index, mode)}
    if mode != WHOLE:
        capacity = {MEMORY: _memory_capacity(gpu.usable_mib)}
        if mode == ComputeMode.SM_SHARING:
            capacity[COMPUTE] = _compute_capacity()
        device["allowMultipleAllocations"] = True
    device["attributes"] = {
        MODE_ATTRIBUTE: {"string": mode},
        "uuid": {"string": gpu.gpu.uuid},
        "index": {"int": gpu.gpu.index},
        "productName": {"string": gpu.gpu.name[:64]},
        "driverVersion": {"string": driver_version[:64]},
    }
    device["capacity"] = capacity
    device["consumesCounters"] = [{"counterSet": counter_set(gpu.gpu.index),
                                   "counters": {OWNER_COUNTER: {"value": "1"}}}]
    if lost is not None:
        device["taints"] = [{"key": LOST_TAINT_KEY, "value": lost[:63], "effect": "NoSchedule"}]
    return device


def node_owner(node: str, node_uid: str) -> dict[str, Any]:
    """The Node as the slices' owner: the garbage collector deletes a deleted node's slices, and a node's agent
    (the chart's policy) writes only slices its own node owns."""
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}


def resource_slices(node: str, gpus: Iterable[SliceGpu], driver_version: str, generation: int, *,
                    offered: Collection[str] = MODES, lost: Mapping[int, str] | None = None,
                    node_uid: str | None = None) -> list[dict[str, Any]]:
    """The node's two ResourceSlices. `generation` grows whenever the content changes, so the scheduler never mixes
    an old slice with a new one. `offered`: the modes published (a mode the node cannot enforce is not); `lost`:
    GPU index -> why it is unhealthy (its devices are tainted); `node_uid`: the Node that owns the slices."""
    ordered = sorted(gpus, key=lambda g: g.gpu.index)
    counters_name, devices_name = slice_names(node)
    pool = {"name": pool_name(node), "generation": generation, "resourceSliceCount": SLICE_COUNT}

    metadata: dict[str, Any] = {"labels": {"gpufrac.io/dra-node": node}}
    if node_uid:
        metadata["ownerReferences"] = [node_owner(node, node_uid)]

    def body(name: str, content: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": {"name": name, **metadata},
                "spec": {"driver": DRIVER, "pool": dict(pool), "nodeName": node, **content}}

    counters = [{"name": counter_set(g.gpu.index), "counters": {OWNER_COUNTER: {"value": "1"}}} for g in ordered]
    devices = [_device(g, mode, driver_version, (lost or {}).get(g.gpu.index))
               for g in ordered for mode in MODES if mode in offered]
    return [body(counters_name, {"sharedCounters": counters}), body(devices_name, {"devices": devices})]



def dropped_fields(wanted: list[dict[str, Any]], stored: list[dict[str, Any]]) -> str | None:
    """What the API server dropped of the slices written (None: nothing): an API server without consumable capacity
    or partitionable devices (before Kubernetes 1.36, or its gates off) stores the slice without those fields, and the
    scheduler would then hand a share out as a whole device, or ignore the one-mode counter."""
    by_name = {s["metadata"]["name"]: s["spec"] for s in stored}
    dropped: set[str] = set()
    for body in wanted:
        spec = by_name.get(body["metadata"]["name"], {})
        if body["spec"].get("sharedCounters") and not spec.get("sharedCounters"):
            dropped.add("sharedCounters")
        kept = {d.get("name"): d for d in spec.get("devices") or []}
        for device in body["spec"].get("devices") or []:
            dropped.update(key for key in ("allowMultipleAllocations", "consumesCounters", "taints")
                           if device.get(key) and not kept.get(device["name"], {}).get(key))
            if "requestPolicy" in str(device.get("capacity")) and "requestPolicy" not in str(
                    kept.get(device["name"], {}).get("capacity")):
                dropped.add("capacity.requestPolicy")
    if not dropped:
        return None
    return (f"the API server dropped {', '.join(sorted(dropped))} from the ResourceSlices: it lacks Kubernetes 1.36's "
            "DRA consumable capacity and partitionable devices (gates DRAConsumableCapacity, DRAPartitionableDevices, "
            "DRADeviceTaints), so shares would not be held apart; the driver needs Kubernetes 1.36+")
