"""What a pod asked for, as typed values: the result (`PodFractions`), what each source reads into, and
the limits and wording the readers and the policies' CEL share."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import MIB

MAX_DEVICES = 64  # one MPS pinned-memory entry per device; no node has more, and it bounds hostile input
MAX_MIB = 1 << 40  # an exbibyte per device: beyond any GPU, and keeps every number small
PORTION_DIGITS = 5  # KAI rejects portion limits with more digits after the point
LISTED_CONTAINERS = 10  # a denial lists the pod's containers, but not thousands of them
PORTION_LIMIT = ann.PORTION_LIMIT_SUFFIX  # the per-container field under `kai.scheduler/container.<c>.`


# Shorthands that apply to one container (gpu-fraction-num-devices applies to the pod).
TARGETING = (ann.FRACTION, ann.MEMORY, ann.FRACTION_LIMIT, ann.MEMORY_LIMIT, ann.COMPUTE_MODE, ann.CONTAINER_NAME)

FRACTION_RANGE = "must be a decimal number strictly between 0 and 1, such as 0.5"
MEMORY_QUANTITY = "must be a Kubernetes memory quantity of at least 1Mi, such as 40Gi"
WHOLE_MIB = "must be a positive whole number of MiB, such as 20480"
DEVICES_LIST = ("must be a comma-separated list of GPUs, each by UUID or CDI device name of one GPU, such as "
                "GPU-<uuid>,GPU-<uuid> or nvidia.com/gpu=GPU-<uuid>, never a name for all GPUs")
COMPUTE_PORTION_RANGE = ("must be a decimal number greater than 0 and at most 1, such as 0.5: the share of the GPU's "
                         "compute the scheduler writes at bind")


@dataclass(frozen=True)
class Memory:
    """Absolute GPU memory per device, in whole MiB."""

    request_mib: int
    limit_mib: int


@dataclass(frozen=True)
class Portion:
    """A share of each device's memory; turned into Memory by the scheduler at bind."""

    fraction: Decimal
    limit: Decimal | None


@dataclass(frozen=True)
class ContainerFraction:
    """What one container asked for. `memory` is None for a portion request that is not bound yet."""

    container: str
    mode: ComputeMode
    num_devices: int
    memory: Memory | None
    portion: Portion | None
    devices: tuple[str, ...]
    compute_portion: float | None = None  # the scheduler's, written at bind (binary64, as KAI's binder wrote it)


@dataclass(frozen=True)
class PodFractions:
    containers: dict[str, ContainerFraction]
    # Per-container keys the webhook writes on CREATE, translated from the pod-level shorthands.
    translated: dict[str, str]
    # What is allowed but ignored, said as an admission warning (on CREATE).
    warnings: tuple[str, ...] = ()

    @property
    def is_fractional(self) -> bool:
        return bool(self.containers)

    def names(self) -> set[str]:
        return set(self.containers)


@dataclass(frozen=True)
class Containers:
    """The containers annotation keys may name: regular, then init (KAI allows init containers too)."""

    names: tuple[str, ...]
    first: str | None  # spec.containers[0], where the shorthands apply by default

    def listing(self) -> str:
        shown = ", ".join(self.names[:LISTED_CONTAINERS]) if self.names else "no containers"
        more = len(self.names) - LISTED_CONTAINERS
        return f"{shown} and {more} more" if more > 0 else shown


@dataclass(frozen=True)
class Shorthands:
    """The pod-level annotations (KAI's older vocabulary), as written."""

    values: Mapping[str, str]

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def targeting(self) -> list[str]:
        """The shorthands present that apply to one container, in a fixed order."""
        return [key for key in TARGETING if key in self.values]


@dataclass(frozen=True)
class ContainerKeys:
    """The per-container keys naming one container, as written: field (a `Field`, or PORTION_LIMIT) -> value."""

    container: str
    fields: Mapping[str, str]

    def key(self, name: str) -> str:
        prefix = ann.KAI_PREFIX if name == PORTION_LIMIT else ann.NVIDIA_PREFIX
        return f"{prefix}{self.container}.{name}"

    def items(self) -> Iterable[tuple[str, str]]:
        """(key, value) of every field, sorted by key so messages come in a stable order."""
        return sorted((self.key(name), value) for name, value in self.fields.items())


@dataclass(frozen=True)
class Target:
    """The container the pod-level shorthands apply to, as KAI's GetFractionContainerRef picks it
    (kai-scheduler/api utilities/resources/gpu_sharing_container_ref.go): the one container the `nvidia.com/container.`
    keys name, else gpu-fraction-container-name, else the first container. When gpu-fraction-container-name names
    another container than those keys, KAI denies the pod; so does gpufrac (the rule `keysNameTheTarget`)."""

    container: str | None
    explicit: bool  # named by gpu-fraction-container-name


@dataclass(frozen=True)
class Amount:
    """A memory quantity, as written and in exact bytes."""

    text: str
    bytes: Decimal

    def describe(self) -> str:
        return f"{int(self.bytes) // MIB} MiB" if self.bytes % MIB == 0 else self.text


@dataclass(frozen=True)
class PodRequest:
    """The pod-level shorthands, read; None where absent or wrong."""

    fraction: Decimal | None
    fraction_text: str | None  # gpu-fraction as written, when present (valid or not)
    fraction_limit: Decimal | None
    memory_mib: int | None
    memory_limit: Amount | None
    num_devices: int
    mode: ComputeMode | None


@dataclass(frozen=True)
class ContainerRequest:
    """What one container's keys (written, or translated from the shorthands) ask for; None where absent or wrong."""

    keys: ContainerKeys
    request: Amount | None
    limit: Amount | None
    mode: ComputeMode | None
    devices: tuple[str, ...]
    portion_limit: Decimal | None
    asks_memory: bool  # a memory key is present, valid or not
    compute_portion: float | None = None
