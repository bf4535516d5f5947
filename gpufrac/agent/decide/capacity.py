"""How much of each GPU's memory workloads can really use. Pure.

NVML's total is not what a scheduler may promise: the driver keeps a reserve (v2 memory info's `reserved`), and
where an MPS control daemon runs, each GPU also holds its MPS server's CUDA context. A scheduler that divides the
total (KAI's `nvidia.com/gpu.memory` label, from GPU Feature Discovery) promises memory no workload can allocate,
and a pod OOMs below its request (KAI issue 2212). The agent publishes what is left: a node label per GPU model
(the smallest of that model's GPUs on the node, in MiB) and a metric per GPU.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpufrac.agent.decide.model import GpuInfo, GpuMemory, GpuProcess
from gpufrac.core.contract import mib_floor

USABLE_LABEL_PREFIX = "gpufrac.io/gpu-memory-usable-mib."
_LABEL_NAME_MAX = 63  # the name part of a label key (after the prefix's `gpufrac.io/`)
_NOT_IN_LABEL = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Usable:
    """One GPU's usable memory and what was taken off its total."""

    gpu: GpuInfo
    total_bytes: int
    reserved_bytes: int
    mps_context_bytes: int

    @property
    def usable_bytes(self) -> int:
        return max(0, self.total_bytes - self.reserved_bytes - self.mps_context_bytes)


def model_slug(name: str) -> str:
    """A GPU's product name as a label-key segment, as GPU Feature Discovery writes `nvidia.com/gpu.product`
    (`NVIDIA H200` → `NVIDIA-H200`), cut to fit a label name."""
    room = _LABEL_NAME_MAX - len(USABLE_LABEL_PREFIX.split("/", 1)[1])
    slug = _NOT_IN_LABEL.sub("-", name.strip()).strip("-._")[:room].rstrip("-._")
    return slug or "unknown"


def usable_label(name: str) -> str:
    return USABLE_LABEL_PREFIX + model_slug(name)


def mps_contexts(processes: Iterable[GpuProcess], server_pids: Iterable[int]) -> dict[str, int]:
    """Per GPU, the memory its MPS servers hold (their processes in NVML's list)."""
    servers = set(server_pids)
    held: dict[str, int] = {}
    for process in processes:
        if process.pid in servers:
            held[process.gpu_uuid] = held.get(process.gpu_uuid, 0) + (process.used_bytes or 0)
    return held


def usable(gpus: Iterable[GpuInfo], memory: Mapping[str, GpuMemory], mps_context: Mapping[str, int]) -> list[Usable]:
    """Each GPU NVML reported memory for, with its reserve and its MPS server's context taken off."""
    result = []
    for gpu in gpus:
        reading = memory.get(gpu.uuid)
        if reading is None:
            continue
        result.append(Usable(gpu, reading.total_bytes, reading.reserved_bytes, mps_context.get(gpu.uuid, 0)))
    return result


def usable_labels(found: Iterable[Usable]) -> dict[str, str]:
    """One label per GPU model: the least usable MiB among this node's GPUs of that model (what each can hold)."""
    least: dict[str, int] = {}
    for item in found:
        key = usable_label(item.gpu.name)
        least[key] = min(least.get(key, item.usable_bytes), item.usable_bytes)
    return {key: str(mib_floor(value)) for key, value in sorted(least.items())}


@dataclass(frozen=True)
class Remembered:
    """The most a GPU's MPS servers were seen holding, and when that figure was last confirmed."""

    held_bytes: int
    seen_at: float


def remember_contexts(before: Mapping[str, Remembered], held: Mapping[str, int], now: float,
                      keep_seconds: float) -> dict[str, Remembered]:
    """Per GPU, the MPS servers' context as remembered after this reading. Servers come and go with their clients,
    so a GPU without one keeps its figure; a larger figure replaces it at once; a smaller one only once the
    remembered figure has gone unconfirmed for `keep_seconds` (the maximum decays: a daemon restarted with
    smaller contexts, or a figure read while a server was starting, does not lower usable memory for ever)."""
    after = dict(before)
    for uuid, now_held in held.items():
        last = before.get(uuid)
        if last is None or now_held >= last.held_bytes or now - last.seen_at >= keep_seconds:
            after[uuid] = Remembered(now_held, now)
    return after
