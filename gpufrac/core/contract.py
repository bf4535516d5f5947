"""The webhook-agent contract: everything the webhook writes into a pod or the node and the agent reads back.

One owner for each piece, so the two programs cannot drift apart:

- the MPS pipe-directory layout (`<mps root>/<mode>`, with the daemon's `control` socket in it);
- the node's enforcement labels (`gpufrac.io/enforcement.<mode>` = driver | mps | none) and the pods' fractional
  label;
- the env names injected into each fractional container (`LimitEnv`), and the values a container with no GPU gets;
- the MPS pinned-memory limit format (`0=4096M,1=4096M` in the annotation, `GPU-<uuid>=4096M` in a created
  container's env), and an sm-sharing container's active-thread percentage;
- MiB, the unit of every canonical value, and its rounding;
- the canonical annotations themselves: `write_canonical` and `read_canonical` are inverse;
- who the scheduler is by default (the identity allowed to write bind-time values);
- how a fractional container gets its mode's MPS directories (`Delivery`): the CSI inline volume of the agent's
  driver, with `pipe` and `shm` directories mounted by subPath, or hostPath volumes.

Pure: no I/O besides logging. See docs/architecture.md, "The contract".
"""

from __future__ import annotations

import hashlib
import logging
import math
import posixpath
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from types import MappingProxyType
from typing import TypeVar

from gpufrac.core.annotations import (
    CANONICAL_PREFIX,
    DEFAULT_MODE,
    CanonicalField,
    ComputeMode,
    Field,
    MalformedKeyError,
    canonical_key,
    nvidia_key,
    parse_container_key,
    parse_devices,
)

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# ---- MiB: every memory value in the contract is whole MiB ----

MIB = 1 << 20


def mib_ceil(value: int | Decimal) -> int:
    """Whole MiB, rounded up so a limit is never tightened below what was asked (`1000M` -> 954)."""
    whole = int(value // MIB)
    return whole + (1 if value % MIB else 0)


def mib_floor(value: int) -> int:
    """Whole MiB, rounded down: what a device really has (a GPU's total memory is not rounded up)."""
    return value // MIB


# ---- the MPS pipe directories ----

DEFAULT_MPS_ROOT = "/run/gpufrac/mps"
MPS_CONTROL_SOCKET = "control"  # what `nvidia-cuda-mps-control -d/-f` creates in its pipe directory


def mps_pipe_dir(root: str, mode: ComputeMode) -> str:
    """The pipe directory of one mode's MPS daemon: what the agent serves and the webhook mounts and injects."""
    return posixpath.join(root, str(mode))


def mps_pipe_dirs(root: str = DEFAULT_MPS_ROOT) -> Mapping[ComputeMode, str]:
    return MappingProxyType({mode: mps_pipe_dir(root, mode) for mode in ComputeMode})


def pipe_dir_mode(path: str) -> ComputeMode | None:
    """The mode whose pipe directory this is (by its last component), None if it is no mode's."""
    name = posixpath.basename(path.rstrip("/"))
    return ComputeMode(name) if name in tuple(ComputeMode) else None


# ---- how the MPS directories reach a fractional container ----
# The CSI inline ephemeral volume of a mode holds two directories, each mounted into the container by subPath:
# `pipe` (the mode's pipe directory, at the path CUDA_MPS_PIPE_DIRECTORY names) and `shm` (the shared memory the MPS
# server uses with its clients, at /dev/shm: as NVIDIA's device plugin hands its MPS clients a shared /dev/shm, since
# a container's own /dev/shm is private to its pod).


class Delivery(StrEnum):
    """How the webhook hands a fractional container its MPS directories."""

    CSI = "csi"  # an inline ephemeral volume served by the agent: allowed by Pod Security baseline and restricted
    HOST_PATH = "hostPath"  # hostPath volumes: needs a privileged Pod Security level in the pod's namespace


DEFAULT_DRIVER_NAME = "mps.gpufrac.io"
MODE_ATTRIBUTE = "mode"  # the one volume attribute the webhook writes: whose directories the volume holds
PIPE_SUBDIR = "pipe"
SHM_SUBDIR = "shm"
SHM_MOUNT_PATH = "/dev/shm"
# The volume context keys the kubelet adds when the CSIDriver has podInfoOnMount: true.
POD_NAME_KEY = "csi.storage.k8s.io/pod.name"
POD_NAMESPACE_KEY = "csi.storage.k8s.io/pod.namespace"
POD_UID_KEY = "csi.storage.k8s.io/pod.uid"
EPHEMERAL_KEY = "csi.storage.k8s.io/ephemeral"


def mps_shm_dir(root: str) -> str:
    """The MPS daemons' shared memory on the host, beside the pipe directories (one for every mode)."""
    return posixpath.join(root, SHM_SUBDIR)


# ---- labels ----

FRACTIONAL_LABEL = "gpufrac.io/fractional"  # on every pod the webhook made fractional; the agent watches these
FRACTIONAL_VALUE = "true"
ENFORCEMENT_LABEL_PREFIX = "gpufrac.io/enforcement."


class Enforcement(StrEnum):
    """How a node enforces a compute mode's memory fractions: the value of `enforcement_label(mode)`."""

    DRIVER = "driver"  # CUDA 13.4 / r615+ memory limits (toolkit hook + driver), MPS v3 memacct
    MPS = "mps"  # legacy MPS pinned device memory limits, served by a healthy MPS daemon
    NONE = "none"  # not enforced on this node


ENFORCING = (Enforcement.DRIVER, Enforcement.MPS)  # the values a pod may require (`requireEnforcingNode`)

# The operator's per-node choice of how fractions reach its GPUs (read by the agent, never written by gpufrac): one
# front door per GPU, or the scheduler and KAI would each think the whole GPU is theirs to divide.
FRONT_DOOR_LABEL = "gpufrac.io/front-door"


class FrontDoor(StrEnum):
    ANNOTATIONS = "annotations"  # annotated fractions (KAI's vocabulary), the webhook and the NRI plugin
    DRA = "dra"  # ResourceClaims of the DRA driver gpu.gpufrac.io


def enforcement_label(mode: ComputeMode) -> str:
    return f"{ENFORCEMENT_LABEL_PREFIX}{mode}"


# After reclaim evicts a pod with a controller, the agent labels its node with this key (value: when the back-off
# ends, epoch seconds) for the back-off, and the webhook gives every fractional pod of that controller a node
# affinity the label's presence fails: its replacement is not placed on that node again meanwhile, by any scheduler.
RECLAIM_BACKOFF_PREFIX = "gpufrac.io/reclaimed."


def reclaim_backoff_label(owner_uid: str) -> str:
    """The node label that keeps a controller's pods off a node where one of them was reclaimed (63-character name
    part: a digest of the controller's UID)."""
    return RECLAIM_BACKOFF_PREFIX + hashlib.sha256(owner_uid.encode()).hexdigest()[:16]


# ---- the injected env ----


class LimitEnv(StrEnum):
    """Env vars the webhook injects into each fractional container, and the agent checks its processes carry."""

    VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
    MEMORY_REQUEST = "NVIDIA_GPU_MEMORY_REQUEST"
    MEMORY_LIMIT = "NVIDIA_GPU_MEMORY_LIMIT"
    PINNED_MEM_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
    PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"
    ACTIVE_THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"  # sm-sharing containers only


NO_GPU = "void"  # NVIDIA_VISIBLE_DEVICES of the containers of a fractional pod that get no GPU
NO_GPU_VALUES = ("void", "none")  # what the NVIDIA runtime reads as "no GPU"
# Env names only the fractional containers may carry, as the webhook sets them.
LIMIT_ENV_PREFIXES = ("CUDA_MPS_", "NVIDIA_GPU_MEMORY_")

# ---- the scheduler ----

DEFAULT_SCHEDULER_USER = "system:serviceaccount:kai-scheduler:binder"  # KAI's binder, which writes bind-time values

# ---- the MPS pinned device memory limit ----

_PINNED_ENTRY = re.compile(r"^([0-9]{1,3})=([0-9]{1,13})M$")  # up to 2**40 MiB, the most the webhook admits


def pinned_limits(limit_mib: int, num_devices: int) -> dict[int, int]:
    """The same limit on each device the client sees, by device index (as CUDA numbers them, from 0)."""
    return dict.fromkeys(range(num_devices), limit_mib)


def format_pinned_mem_limit(limits: Mapping[int, int]) -> str:
    """CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: device index -> MiB, `0=61440M,1=61440M`."""
    return ",".join(f"{index}={mib}M" for index, mib in sorted(limits.items()))


def parse_pinned_mem_limit(text: str) -> dict[int, int]:
    """Device index -> MiB, from the value format_pinned_mem_limit writes; ValueError for anything else."""
    limits: dict[int, int] = {}
    for entry in text.split(","):
        match = _PINNED_ENTRY.fullmatch(entry.strip())
        if match is None:
            raise ValueError(f"not an MPS pinned memory limit entry: {entry!r}")
        limits[int(match[1])] = int(match[2])
    return limits


# The same variable keyed by GPU UUID, as the agent's NRI plugin rewrites it at creation from the bound GPUs: an
# index names a GPU by the client's view, so a process that narrows CUDA_VISIBLE_DEVICES makes `1=` name a GPU it
# cannot see, and CUDA then drops every entry (NVIDIA's measurement, r615); a UUID names the same GPU in every view.
_PINNED_UUID_ENTRY = re.compile(r"^((?:GPU|MIG)-[0-9A-Za-z-]{1,80})=([0-9]{1,13})M$")


def is_gpu_uuid(identifier: str) -> bool:
    """A GPU or MIG UUID as NVML spells it (`GPU-8f0c…`), not an index or a CDI name."""
    return identifier.startswith(("GPU-", "MIG-")) and "=" not in identifier and "," not in identifier


def format_pinned_mem_limit_by_uuid(limit_mib: int, uuids: Iterable[str]) -> str:
    """CUDA_MPS_PINNED_DEVICE_MEM_LIMIT keyed by UUID: `GPU-a=61440M,GPU-b=61440M`, in the order given."""
    uuids = tuple(uuids)
    bad = [u for u in uuids if not is_gpu_uuid(u)]
    if bad or not uuids:
        raise ValueError(f"a UUID-keyed pinned limit needs GPU UUIDs, not {', '.join(bad) or 'none'}")
    return ",".join(f"{uuid}={limit_mib}M" for uuid in dict.fromkeys(uuids))


def parse_pinned_mem_limit_keys(text: str) -> dict[str, int]:
    """Key (an index or a UUID, as written) -> MiB, from either spelling; ValueError for anything else, or for a
    value that mixes the two (CUDA reads a mix against one view of the GPUs, which breaks one of them)."""
    limits: dict[str, int] = {}
    for entry in text.split(","):
        match = _PINNED_ENTRY.fullmatch(entry.strip()) or _PINNED_UUID_ENTRY.fullmatch(entry.strip())
        if match is None:
            raise ValueError(f"not an MPS pinned memory limit entry: {entry!r}")
        limits[match[1]] = int(match[2])
    if len({key.isdigit() for key in limits}) > 1:
        raise ValueError(f"an MPS pinned memory limit keys its GPUs by index or by UUID, not both: {text!r}")
    return limits


def pinned_limit_agrees(text: str, declared: Mapping[int, int], own_uuids: Collection[str] = ()) -> bool:
    """Whether a container's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT says what the canonical annotation declares: the same
    entries by index as the webhook writes them, or (rewritten by the NRI plugin) the same limits, one per GPU, keyed
    by UUID. Keyed by UUID, the keys must be the container's own GPUs (`own_uuids`, where known): an entry naming a
    GPU the process cannot see drops every pinned limit it has (NVIDIA's measurement on r615), so a foreign UUID is
    a mismatch however its value reads."""
    try:
        found = parse_pinned_mem_limit_keys(text)
    except ValueError:
        return False
    if all(key.isdigit() for key in found):
        return {int(key): mib for key, mib in found.items()} == dict(declared)
    if own_uuids and set(found) != set(own_uuids):
        return False
    return sorted(found.values()) == sorted(declared.values())


# ---- the MPS active-thread percentage (an sm-sharing container's compute share) ----

NO_COMPUTE_CAP = 100  # an sm-sharing container whose bind wrote no compute portion: all of the GPU's threads


def active_thread_percent(portion: float) -> int:
    """CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for a compute portion in (0, 1], as KAI's node agent computes it: floored
    (0.336 -> 33, so three such clients never ask for more than the GPU), at least 1 (MPS reads 0 as no limit), and
    from the binary64 number the scheduler wrote (0.29 -> 28: never above the portion)."""
    if not 0 < portion <= 1:
        raise ValueError(f"a compute portion is in (0, 1], not {portion!r}")
    return max(1, math.floor(portion * 100))


def _percent_value(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,3}", text) or not 1 <= int(text) <= NO_COMPUTE_CAP:
        raise ValueError("expected a whole percentage from 1 to 100")
    return int(text)


# ---- the canonical annotations ----


@dataclass(frozen=True)
class CanonicalFraction:
    """One container's fraction as the node sees it: what the webhook wrote under `gpufrac.io/container.<c>.`,
    plus the devices the scheduler assigned (`nvidia.com/container.<c>.gpus.devices`).

    Request and limit are None for a portion pod before its bind; devices are () until the scheduler writes them.
    """

    container: str
    mode: ComputeMode
    request_mib: int | None
    limit_mib: int | None
    pinned_mem_limit_mib: Mapping[int, int] = field(default_factory=dict)
    devices: tuple[str, ...] = ()
    active_thread_percent: int | None = None  # sm-sharing only


def write_canonical(fractions: Iterable[CanonicalFraction]) -> dict[str, str]:
    """The annotations that carry these fractions. Devices are written only where a fraction has them: the webhook
    leaves that key to the user or the scheduler, who own it; its fractions carry none."""
    result: dict[str, str] = {}
    for f in fractions:
        result[canonical_key(f.container, CanonicalField.COMPUTE_MODE)] = str(f.mode)
        if f.request_mib is not None:
            result[canonical_key(f.container, CanonicalField.REQUEST_MIB)] = str(f.request_mib)
        if f.limit_mib is not None:
            result[canonical_key(f.container, CanonicalField.LIMIT_MIB)] = str(f.limit_mib)
        if f.pinned_mem_limit_mib:
            result[canonical_key(f.container, CanonicalField.MPS_PINNED_MEM_LIMIT)] = \
                format_pinned_mem_limit(f.pinned_mem_limit_mib)
        if f.active_thread_percent is not None:
            result[canonical_key(f.container, CanonicalField.ACTIVE_THREAD_PERCENT)] = str(f.active_thread_percent)
        if f.devices:
            result[nvidia_key(f.container, Field.DEVICES)] = ",".join(f.devices)
    return result


@dataclass(frozen=True)
class UnreadableCanonical:
    """A canonical annotation that does not parse; its container (when the key names one) is left out."""

    key: str
    value: str
    reason: str
    container: str | None


@dataclass(frozen=True)
class CanonicalRead:
    fractions: dict[str, CanonicalFraction]
    unreadable: tuple[UnreadableCanonical, ...] = ()


_MIB_VALUE = re.compile(r"^[0-9]{1,15}$")


def _mib_value(text: str) -> int:
    if not _MIB_VALUE.fullmatch(text):
        raise ValueError("expected whole MiB, such as 4096")
    return int(text)


def _parsed(key: str, text: str, parse: Callable[[str], _T]) -> _T:
    try:
        return parse(text)
    except ValueError as err:
        raise _FieldError(key, text, str(err) or "not valid") from err


def _read_one(container: str, values: Mapping[str, str], devices: str | None) -> CanonicalFraction:
    """One container's fraction; _FieldError naming the key whose value does not parse."""
    def value(which: CanonicalField, parse: Callable[[str], _T], absent: _T) -> _T:
        text = values.get(which)
        return absent if text is None else _parsed(canonical_key(container, which), text, parse)

    return CanonicalFraction(
        container=container,
        mode=value(CanonicalField.COMPUTE_MODE, ComputeMode, DEFAULT_MODE),
        request_mib=value(CanonicalField.REQUEST_MIB, _mib_value, None),
        limit_mib=value(CanonicalField.LIMIT_MIB, _mib_value, None),
        pinned_mem_limit_mib=value(CanonicalField.MPS_PINNED_MEM_LIMIT, parse_pinned_mem_limit, {}),
        devices=_parsed(nvidia_key(container, Field.DEVICES), devices, parse_devices) if devices else (),
        active_thread_percent=value(CanonicalField.ACTIVE_THREAD_PERCENT, _percent_value, None),
    )


class _FieldError(ValueError):
    def __init__(self, key: str, value: str, reason: str) -> None:
        super().__init__(reason)
        self.key, self.value, self.reason = key, value, reason


def read_canonical(annotations: Mapping[str, str]) -> CanonicalRead:
    """The fractional containers of an admitted pod, by name: the inverse of `write_canonical`.

    A container whose canonical values do not parse is left out of `fractions`, never silently: it is logged
    and listed in `unreadable` (the agent exposes the count as a metric).
    """
    fields: dict[str, dict[str, str]] = {}
    unreadable: list[UnreadableCanonical] = []
    for key, value in annotations.items():
        if not key.startswith(CANONICAL_PREFIX):
            continue
        try:
            parsed = parse_container_key(key)
        except MalformedKeyError as err:
            unreadable.append(UnreadableCanonical(key, value, err.accepted, None))
            continue
        if parsed is not None:
            fields.setdefault(parsed.container, {})[parsed.suffix] = value
    fractions: dict[str, CanonicalFraction] = {}
    for container, values in fields.items():
        try:
            fractions[container] = _read_one(container, values, annotations.get(nvidia_key(container, Field.DEVICES)))
        except _FieldError as err:
            unreadable.append(UnreadableCanonical(err.key, err.value, err.reason, container))
    for item in unreadable:
        log.warning("canonical annotation %s=%r does not parse (%s): %s", item.key, item.value, item.reason,
                    f"container {item.container} is not audited" if item.container else "ignored",
                    extra={"annotation": item.key, "container": item.container})
    return CanonicalRead(fractions, tuple(unreadable))
