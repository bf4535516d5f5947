"""Which whole GPUs the kubelet allocated to which container: its device manager's checkpoint, parsed. Pure.

The kubelet's device manager records every allocation a device plugin answered in
`/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint` (beside its socket, a path compiled into the kubelet
whatever its --root-dir; format: k8s.io/kubernetes pkg/kubelet/cm/devicemanager/checkpoint, v2 since 1.20), and
writes it when it allocates, during the pod's admission, so before the runtime creates the container:

    {"Data": {"PodDeviceEntries": [{"PodUID": "...", "ContainerName": "app", "ResourceName": "nvidia.com/gpu",
                                    "DeviceIDs": {"0": ["GPU-..."]}, "AllocResp": "<base64 protobuf>"}],
              "RegisteredDevices": {"nvidia.com/gpu": ["GPU-..."]}},
     "Checksum": 1234}

`DeviceIDs` maps a NUMA node (`-1`: none) to the IDs the device plugin advertised: NVIDIA's are GPU (or MIG) UUIDs,
`<uuid>::<n>` for the replicas of its own time-slicing sharing. A container's allocation is every ID of every
`nvidia.com/` resource the kubelet allocated to it, replicas folded onto their GPU. The checksum is Go's hash of Go's
struct and is not recomputed: the kubelet writes the file atomically (a temporary file renamed), so a reader never
sees half of one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

CHECKPOINT_NAME = "kubelet_internal_checkpoint"
# NVIDIA's device plugin's resources: nvidia.com/gpu, its renamed shared ones (nvidia.com/gpu.shared), MIG profiles.
GPU_RESOURCE_PREFIX = "nvidia.com/"
REPLICA_SEPARATOR = "::"  # NVIDIA's device plugin names the replicas of a shared GPU `<uuid>::<n>`


class CheckpointError(ValueError):
    """The checkpoint is not the kubelet's device manager checkpoint (v2): what is wrong, in one line."""


@dataclass(frozen=True)
class KubeletAllocations:
    """The device IDs the kubelet allocated per (pod UID, container name), replicas folded; or why not known."""

    devices: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    problem: str | None = None  # why the allocations are not known now (None: known)

    def of(self, pod_uid: str, container: str) -> frozenset[str]:
        return self.devices.get((pod_uid, container), frozenset())

    def allocated(self) -> frozenset[str]:
        """Every device ID the kubelet allocated to some container (replicas folded): GPUs NVIDIA's device plugin
        gave out whole, which the DRA driver must not share out too."""
        return frozenset(i for ids in self.devices.values() for i in ids)


NO_ALLOCATIONS = KubeletAllocations()  # a node where no device plugin ever registered: the kubelet allocated nothing


def unknown(problem: str) -> KubeletAllocations:
    return KubeletAllocations(problem=problem)


def gpu_of(device_id: str) -> str:
    """The GPU a device plugin's ID names: `GPU-a::3` (a replica) is `GPU-a`."""
    return device_id.partition(REPLICA_SEPARATOR)[0]


def parse_checkpoint(text: str | bytes) -> KubeletAllocations:
    """The allocations of `nvidia.com/` resources in the checkpoint's text. CheckpointError for anything else."""
    try:
        document = json.loads(text)
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(f"not JSON ({err})") from err
    data = document.get("Data") if isinstance(document, dict) else None
    if not isinstance(data, dict):
        raise CheckpointError("no `Data` object: not a kubelet device manager checkpoint")
    entries = data.get("PodDeviceEntries")
    if entries is None:  # Go writes a nil slice as null: no allocation
        return KubeletAllocations({})
    if not isinstance(entries, list):
        raise CheckpointError("`Data.PodDeviceEntries` is not a list")
    devices: dict[tuple[str, str], set[str]] = {}
    for number, entry in enumerate(entries):
        key, ids = _entry(entry, number)
        if key is not None:
            devices.setdefault(key, set()).update(gpu_of(i) for i in ids)
    return KubeletAllocations({key: frozenset(ids) for key, ids in devices.items()})


def _entry(entry: Any, number: int) -> tuple[tuple[str, str] | None, list[str]]:
    """One PodDeviceEntries item: its (pod UID, container) when its resource is NVIDIA's, and its device IDs."""
    where = f"`Data.PodDeviceEntries[{number}]`"
    if not isinstance(entry, dict):
        raise CheckpointError(f"{where} is not an object")
    fields = [value for name in ("PodUID", "ContainerName", "ResourceName")
              if isinstance(value := entry.get(name), str) and value]
    if len(fields) != 3:
        raise CheckpointError(f"{where} lacks one of PodUID, ContainerName, ResourceName")
    pod_uid, container, resource = fields
    if not resource.startswith(GPU_RESOURCE_PREFIX):
        return None, []
    return (pod_uid, container), _device_ids(entry.get("DeviceIDs"), where)


def _device_ids(value: Any, where: str) -> list[str]:
    """DeviceIDs: a map of NUMA node to IDs (v2), or a plain list (the v1 format of kubelets before 1.20)."""
    groups = list(value.values()) if isinstance(value, dict) else [value] if isinstance(value, list) else None
    if groups is None:
        raise CheckpointError(f"{where}.DeviceIDs is neither a map of NUMA node to IDs nor a list")
    items = [i for group in groups if group is not None for i in (group if isinstance(group, list) else [None])]
    ids = [i for i in items if isinstance(i, str) and i]
    if len(ids) != len(items):
        raise CheckpointError(f"{where}.DeviceIDs holds something other than device ID strings")
    return ids
