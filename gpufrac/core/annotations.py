"""The fraction annotation grammar (docs/architecture.md, "The annotations"): every key gpufrac reads or writes.

Pure: no I/O, no Kubernetes client. The webhook uses it to read what users and the scheduler write; the canonical
values it writes for the node, and their reader, are the contract's (`gpufrac.core.contract`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

# Pod-level shorthands: KAI's older vocabulary, translated to the per-container form.
FRACTION = "gpu-fraction"
FRACTION_LIMIT = "gpu-fraction.limit"
MEMORY = "gpu-memory"
MEMORY_LIMIT = "gpu-memory.limit"
NUM_DEVICES = "gpu-fraction-num-devices"
CONTAINER_NAME = "gpu-fraction-container-name"
# KAI's pod-level compute mode (its gpu-sharing docs), translated to `nvidia.com/container.<c>.gpu-compute.mode`.
COMPUTE_MODE = "kai.scheduler/gpu-compute-sharing-mode"
SHORTHAND_KEYS = (FRACTION, FRACTION_LIMIT, MEMORY, MEMORY_LIMIT, NUM_DEVICES, CONTAINER_NAME, COMPUTE_MODE)

NVIDIA_PREFIX = "nvidia.com/container."
KAI_PREFIX = "kai.scheduler/container."
GPUFRAC_DOMAIN = "gpufrac.io/"
CANONICAL_PREFIX = "gpufrac.io/container."

WHOLE_GPU_RESOURCE = "nvidia.com/gpu"

# A container name is a DNS-1123 label, so it holds no dot and the key splits unambiguously.
CONTAINER_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_CONTAINER_NAME = re.compile(CONTAINER_NAME_PATTERN)
# The name part of an annotation key (after the `prefix/`) is at most 63 characters.
KEY_NAME_MAX = 63


class ComputeMode(StrEnum):
    TIME_SLICING = "time-slicing"
    SM_SHARING = "sm-sharing"


DEFAULT_MODE = ComputeMode.TIME_SLICING


class Field(StrEnum):
    """Per-container keys users and the scheduler write, under `nvidia.com/container.<c>.`."""

    MEMORY_REQUEST = "gpu-memory.request"
    MEMORY_LIMIT = "gpu-memory.limit"
    COMPUTE_MODE = "gpu-compute.mode"
    DEVICES = "gpus.devices"
    # The share of a GPU's compute the scheduler charged the container for, in (0, 1], written at bind (KAI's binder,
    # kai-scheduler/KAI-Scheduler PR 2368); sm-sharing enforces it as an MPS active-thread percentage.
    COMPUTE_PORTION = "gpu-compute.portion"


# What only the scheduler writes, at bind: which GPUs, and how much of their compute.
BIND_ONLY_FIELDS = (Field.DEVICES, Field.COMPUTE_PORTION)


# The one key KAI writes under its own prefix.
PORTION_LIMIT_SUFFIX = "gpu-memory.portion.limit"


class CanonicalField(StrEnum):
    """What the webhook writes under `gpufrac.io/container.<c>.`, in forms the node uses directly."""

    REQUEST_MIB = "gpu-memory.request-mib"
    LIMIT_MIB = "gpu-memory.limit-mib"
    MPS_PINNED_MEM_LIMIT = "mps-pinned-mem-limit"
    COMPUTE_MODE = "compute-mode"
    ACTIVE_THREAD_PERCENT = "active-thread-percent"  # sm-sharing: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, 1..100


_SUFFIXES: dict[str, tuple[str, ...]] = {
    NVIDIA_PREFIX: tuple(Field),
    KAI_PREFIX: (PORTION_LIMIT_SUFFIX,),
    CANONICAL_PREFIX: tuple(CanonicalField),
}


class MalformedKeyError(ValueError):
    """An annotation key under one of our prefixes that does not follow the grammar."""

    def __init__(self, key: str, accepted: str) -> None:
        super().__init__(f"annotation key {key} is not valid: {accepted}")
        self.key = key
        self.accepted = accepted


@dataclass(frozen=True)
class ContainerKey:
    """A parsed per-container key, e.g. `nvidia.com/container.app.gpu-memory.request`."""

    key: str
    prefix: str
    container: str
    suffix: str


def nvidia_key(container: str, field: Field) -> str:
    return f"{NVIDIA_PREFIX}{container}.{field}"


def portion_limit_key(container: str) -> str:
    return f"{KAI_PREFIX}{container}.{PORTION_LIMIT_SUFFIX}"


def canonical_key(container: str, field: CanonicalField) -> str:
    return f"{CANONICAL_PREFIX}{container}.{field}"


def names_a_mode(annotations: Mapping[str, object]) -> bool:
    """Whether a pod's own annotations name a compute mode (KAI's pod-level key or a container's `gpu-compute.mode`):
    where none does, the fraction is time-slicing (DEFAULT_MODE), or what the webhook's default mode writes."""
    return COMPUTE_MODE in annotations or any(
        isinstance(k, str) and k.startswith(NVIDIA_PREFIX) and k.endswith("." + Field.COMPUTE_MODE)
        for k in annotations)


def is_fraction_key(key: str) -> bool:
    """Whether a pod annotation belongs to the fraction contract (the webhook reviews every pod carrying one)."""
    return key in SHORTHAND_KEYS or key.startswith((NVIDIA_PREFIX, KAI_PREFIX, GPUFRAC_DOMAIN))


_OURS = (*_SUFFIXES, GPUFRAC_DOMAIN)


def key_suffixes() -> dict[str, tuple[str, ...]]:
    """Per-container prefix -> the fields a key under it may name (the grammar the admission policies check too)."""
    return dict(_SUFFIXES)


def accepted_keys(prefix: str) -> str:
    """What a malformed key under `prefix` (one of key_suffixes(), or GPUFRAC_DOMAIN) should have been."""
    if prefix in _SUFFIXES:
        return f"expected {prefix}<container>.<{'|'.join(_SUFFIXES[prefix])}>"
    return (f"the {GPUFRAC_DOMAIN} annotations are {CANONICAL_PREFIX}<container>.<{'|'.join(CanonicalField)}>, "
            "written by the webhook")


def parse_container_key(key: str) -> ContainerKey | None:
    """Split a per-container key; None for keys outside our prefixes; MalformedKeyError for a bad one inside."""
    return _parse_container_key(key) if key.startswith(_OURS) else None


@functools.lru_cache(maxsize=4096)  # pure, and a pod's keys come again in its next review (and in the next pod's)
def _parse_container_key(key: str) -> ContainerKey | None:
    for prefix, suffixes in _SUFFIXES.items():
        if not key.startswith(prefix):
            continue
        container, _, suffix = key[len(prefix):].partition(".")
        if not _CONTAINER_NAME.fullmatch(container) or suffix not in suffixes:
            raise MalformedKeyError(key, accepted_keys(prefix))
        return ContainerKey(key, prefix, container, suffix)
    if key.startswith(GPUFRAC_DOMAIN):
        raise MalformedKeyError(key, accepted_keys(GPUFRAC_DOMAIN))
    return None


def key_name_length(key: str) -> int:
    """Length of the name part of an annotation key (after `prefix/`); Kubernetes allows at most 63."""
    return len(key.partition("/")[2])


def key_fits(key: str) -> bool:
    return key_name_length(key) <= KEY_NAME_MAX


def longest_key_name(container: str) -> int:
    """Length of the longest annotation key name gpufrac may need for this container (limit: 63)."""
    return max(len(k.partition("/")[2]) for k in (
        portion_limit_key(container),
        nvidia_key(container, Field.MEMORY_REQUEST),
        *(canonical_key(container, f) for f in CanonicalField),
    ))


def max_container_name_length() -> int:
    """Longest container name whose keys are all valid annotation keys."""
    return KEY_NAME_MAX - longest_key_name("")


# One GPU per entry: a UUID, an index, or a CDI name of one GPU (a MIG device by `<gpu>:<mig>` too). Never a name
# for many, such as `nvidia.com/gpu=all`: a fraction bound to every GPU would get them all without the scheduler.
_ONE_GPU = r"GPU-[0-9a-zA-Z-]{1,64}|MIG-[0-9a-zA-Z/-]{1,96}|[0-9]{1,3}"
DEVICE_ID_PATTERN = rf"^(?:{_ONE_GPU}|[a-z0-9.-]+/[a-z0-9.-]+=(?:{_ONE_GPU}|[0-9]{{1,3}}:[0-9]{{1,3}}))$"
_DEVICE_ID = re.compile(DEVICE_ID_PATTERN)


def parse_devices(text: str) -> tuple[str, ...]:
    """`GPU-a,GPU-b`: GPU/MIG UUIDs, indexes, or CDI names (`k8s.device-plugin.nvidia.com/gpu=GPU-a`).

    Raises ValueError naming the first bad entry; empty entries and duplicates are bad too.
    """
    devices = tuple(d.strip() for d in text.split(","))
    for device in devices:
        if not _DEVICE_ID.fullmatch(device):
            raise ValueError(device or "(empty entry)")
    if len(set(devices)) != len(devices):
        raise ValueError("a device listed twice")
    return devices


def device_id(device: str) -> str:
    """The GPU a device entry names: a CDI name (`k8s.device-plugin.nvidia.com/gpu=GPU-a`, `nvidia.com/gpu=0`) ends
    with `=<uuid or index>`; a bare UUID or index is itself."""
    return device.rpartition("=")[2]


def is_container_name(name: str) -> bool:
    return bool(_CONTAINER_NAME.fullmatch(name))
