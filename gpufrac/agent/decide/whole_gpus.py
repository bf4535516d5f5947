"""Whole GPUs beside NVIDIA's device plugin: what a container that is no fraction names as its GPUs, and whether the
kubelet allocated them to it. Pure.

NVIDIA's device plugin hands a container its GPUs in one of four ways (`DEVICE_LIST_STRATEGY`), each of which the
kubelet merges into the container it asks the runtime to create:
- `envvar`: `NVIDIA_VISIBLE_DEVICES=<uuid,...>` in the env;
- `volume-mounts`: `NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices` and one mount of /dev/null at
  `/var/run/nvidia-container-devices/<uuid>` per GPU;
- `cdi-annotations`: a `cdi.k8s.io/nvidia-device-plugin_<id>` annotation listing
  `k8s.device-plugin.nvidia.com/gpu=<uuid>`;
- `cdi-cri`: the same CDI names as the container's CDI devices (the runtime tells NRI plugins of them from containerd
  2.2; earlier, containerd's CDI edits have already set `NVIDIA_VISIBLE_DEVICES=void` by then).
Any pod can write the first two into its own env and mounts, so what a container names proves nothing by itself; the
kubelet's device checkpoint (`kubelet_allocations`) says what the kubelet allocated. `judge` compares the two.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from gpufrac.agent.decide.kubelet_allocations import KubeletAllocations, gpu_of
from gpufrac.agent.decide.model import GpuInfo
from gpufrac.core.annotations import device_id
from gpufrac.core.contract import NO_GPU_VALUES, LimitEnv

VOLUME_MOUNT_ROOT = "/var/run/nvidia-container-devices"  # the device plugin's volume-mounts strategy
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"  # CDI's annotations, read by containerd and NVIDIA's runtime
ALL = "all"  # no device plugin grants `all`: an image's default (CUDA images set it) or a pod's own claim


@dataclass(frozen=True)
class NamedGpus:
    """The GPUs a container names, by where NVIDIA's runtime or containerd would read them."""

    env: tuple[str, ...] = ()  # NVIDIA_VISIBLE_DEVICES's IDs, or the volume mounts it points at (`all` kept)
    cdi: tuple[str, ...] = ()  # GPU CDI names: the container's CDI devices and its cdi.k8s.io/ annotations

    def __bool__(self) -> bool:
        return bool(self.env or self.cdi)


def named_gpus(env: Mapping[str, str], annotations: Mapping[str, str], cdi_devices: Iterable[str],
               mounts: Iterable[str]) -> NamedGpus:
    visible = (env.get(LimitEnv.VISIBLE_DEVICES) or "").strip()
    if visible in ("", *NO_GPU_VALUES):
        ids: tuple[str, ...] = ()
    elif visible.rstrip("/") == VOLUME_MOUNT_ROOT:
        ids = tuple(sorted(m.rstrip("/").rpartition("/")[2] for m in mounts
                           if m.rstrip("/").rpartition("/")[0] == VOLUME_MOUNT_ROOT))
    else:
        ids = tuple(i.strip() for i in visible.split(",") if i.strip())
    listed = [name.strip() for key, value in sorted(annotations.items()) if key.startswith(CDI_ANNOTATION_PREFIX)
              for name in value.split(",")]
    cdi = tuple(dict.fromkeys(name for name in [*cdi_devices, *listed] if is_gpu_cdi_name(name)))
    return NamedGpus(ids, cdi)


def is_gpu_cdi_name(name: str) -> bool:
    """A CDI name of an NVIDIA GPU (`k8s.device-plugin.nvidia.com/gpu=...`, `nvidia.com/gpu=...`); not IMEX
    channels, management devices or other vendors'."""
    kind, sep, _ = name.partition("=")
    vendor, _, device_class = kind.partition("/")
    return bool(sep) and device_class == "gpu" and (vendor == "nvidia.com" or vendor.endswith(".nvidia.com"))


class Verdict(StrEnum):
    NONE_NAMED = "none-named"  # names no GPU
    ALLOCATED = "allocated"  # names only GPUs the kubelet allocated to it: the device plugin's, left alone
    NOT_ALLOCATED = "not-allocated"  # names GPUs the kubelet allocated none of: its env grant is voided
    ENV_BEYOND_CDI = "env-beyond-cdi"  # its CDI devices carry its allocation; its env names more: voided
    BEYOND = "beyond"  # names GPUs beyond its allocation and voiding would take the allocation too: refused
    UNKNOWN = "unknown"  # names GPUs by ID while the allocations are unknown: refused until they are known


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    allocated: tuple[str, ...] = ()  # the GPUs the kubelet allocated (UUIDs where NVML knows them)
    beyond: tuple[str, ...] = ()  # what the container names beyond them


def judge(named: NamedGpus, allocations: KubeletAllocations, pod_uid: str, container: str,
          gpus: Iterable[GpuInfo] = ()) -> Judgement:
    """Whether the GPUs a container names are the ones the kubelet allocated to it.

    Allocations unknown (the checkpoint unreadable): a container naming GPUs by ID may be a device plugin's envvar
    grant, or a pod's own claim: neither is voided nor let through, it is refused until the checkpoint reads again
    (the kubelet retries the creation). `all` and CDI devices are treated as when nothing is allocated: no device
    plugin grants `all`, and CDI devices were always left to whoever put them there.
    """
    if not named:
        return Judgement(Verdict.NONE_NAMED)
    known = tuple(gpus)
    if allocations.problem is not None:
        by_id = named.env and ALL not in named.env
        return Judgement(Verdict.UNKNOWN if by_id else Verdict.NOT_ALLOCATED)
    allocated = {_identity(i, known) for i in allocations.of(pod_uid, container)}
    if not allocated:
        return Judgement(Verdict.NOT_ALLOCATED)
    listed = tuple(sorted(allocated))
    cdi_beyond = tuple(c for c in named.cdi if _identity(device_id(c), known) not in allocated)
    if cdi_beyond:
        return Judgement(Verdict.BEYOND, listed, cdi_beyond)
    env_beyond = tuple(i for i in named.env if _identity(i, known) not in allocated)
    if not env_beyond:
        return Judgement(Verdict.ALLOCATED, listed)
    return Judgement(Verdict.ENV_BEYOND_CDI if named.cdi else Verdict.BEYOND, listed, env_beyond)


def _identity(device: str, gpus: tuple[GpuInfo, ...]) -> str:
    """One spelling per GPU: a replica is its GPU, an index (the device plugin's deviceIDStrategy=index) its UUID."""
    plain = gpu_of(device)
    return next((g.uuid for g in gpus if plain in (g.uuid, str(g.index))), plain)
