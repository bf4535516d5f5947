"""Which GPUs run in EXCLUSIVE_PROCESS compute mode: those serving sm-sharing fractions.

A process of an sm-sharing container that drops its pipe directory (`env -i`, or unsets CUDA_MPS_PIPE_DIRECTORY) is an
ordinary CUDA process: in the DEFAULT compute mode it gets the whole GPU, all SMs, and nothing reports an error. In
EXCLUSIVE_PROCESS the MPS server holds the GPU's one context, so such a process gets no context at all; NVIDIA
recommends EXCLUSIVE_PROCESS with MPS (reference/nvidia-stack.md). The agent sets it, through NVML, on every GPU
an sm-sharing fraction is placed on (before the NRI plugin answers its creation, and on each pass), and gives a GPU
back the mode it found there once no sm-sharing fraction is placed on it.

Pure: the plan from the placed fractions, the inventory and what the agent set before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpufrac.agent.decide.model import GpuInfo, RunningContainer
from gpufrac.agent.decide.mps_limits import gpu_uuid
from gpufrac.core.annotations import ComputeMode

DEFAULT = 0  # NVML_COMPUTEMODE_DEFAULT
EXCLUSIVE_PROCESS = 3  # NVML_COMPUTEMODE_EXCLUSIVE_PROCESS


def sm_sharing_gpus(containers: Iterable[RunningContainer], gpus: Sequence[GpuInfo]) -> set[str]:
    """The UUIDs of the GPUs an sm-sharing fraction is placed on (devices named by UUID, index or CDI name)."""
    found = (gpu_uuid(d, gpus) for c in containers if c.mode is ComputeMode.SM_SHARING for d in c.fraction.devices)
    return {uuid for uuid in found if uuid is not None}


@dataclass(frozen=True)
class ModePlan:
    exclusive: tuple[str, ...]  # GPUs to set EXCLUSIVE_PROCESS on (where they are not already)
    restore: tuple[tuple[str, int], ...]  # (GPU, the mode the agent found there) to give back


def plan(serving: set[str], found: Mapping[str, int]) -> ModePlan:
    """`found`: for each GPU the agent set, the mode it had before. A GPU serving sm-sharing is made exclusive; one
    the agent made exclusive that no longer serves it gets its mode back."""
    return ModePlan(tuple(sorted(serving)),
                    tuple(sorted((uuid, mode) for uuid, mode in found.items() if uuid not in serving)))
