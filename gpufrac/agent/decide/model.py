"""The agent's domain, as plain typed values. Everything here is immutable and free of I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import CanonicalFraction, mib_floor


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_total_bytes: int

    @property
    def memory_total_mib(self) -> int:
        return mib_floor(self.memory_total_bytes)


@dataclass(frozen=True)
class Inventory:
    """What NVML says about this node."""

    driver_version: str
    cuda_driver_version: int  # e.g. 13040 for CUDA 13.4
    gpus: tuple[GpuInfo, ...]

    def by_uuid(self) -> dict[str, GpuInfo]:
        return {gpu.uuid: gpu for gpu in self.gpus}


@dataclass(frozen=True)
class GpuProcess:
    """One NVML compute process on one GPU."""

    gpu_uuid: str
    pid: int
    used_bytes: int | None  # None: NVML could not tell
    sm_util: int | None  # percent, latest sample; None: no sample this interval


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory now (NVML's v2 memory info): total = reserved + used + free."""

    gpu_uuid: str
    total_bytes: int
    reserved_bytes: int  # kept by the driver and firmware: no workload can have it
    used_bytes: int  # allocated by processes (MPS servers included)
    free_bytes: int


class EvictionOutcome(StrEnum):
    """What the Eviction API answered."""

    EVICTED = "evicted"
    BLOCKED = "blocked"  # 429: a PodDisruptionBudget allows no disruption now (or the API server throttles)
    GONE = "gone"  # 404: the pod is gone already
    NOT_KEPT_OFF = "not-kept-off"  # not asked for: its controller's back-off label could not be put on the node


class DaemonState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    BACKOFF = "backoff"
    FAILED = "failed"  # restart budget exhausted
    STOPPED = "stopped"


@dataclass(frozen=True)
class DaemonStatus:
    mode: ComputeMode
    state: DaemonState
    up: bool  # running and its control socket exists
    restarts: int
    failure: str | None = None  # why it is FAILED, for the node condition
    last_exit: str | None = None  # how the last run ended ("exited with code 1"), while a restart is pending
    pid: int | None = None  # the control daemon's process (host PID namespace)
    # the gpufrac build of the `gpufrac mps` supervising an external daemon ("unknown" when its status file does not
    # say); None for a daemon the agent runs itself
    build: str | None = None


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class NodeCondition:
    status: ConditionStatus
    reason: str  # CamelCase
    message: str


@dataclass(frozen=True)
class RunningContainer:
    """A running container of a fractional pod bound to this node, with what the webhook wrote for it; or a DRA
    claim's share of a GPU, with what Prepare wrote for it (`claim` set)."""

    namespace: str
    pod: str
    pod_uid: str
    container: str
    container_id: str  # without the runtime scheme
    fraction: CanonicalFraction
    # A DRA claim's share: `<claim>/<request>`, also its `container` (a claim may serve several containers, the
    # driver does not know which); its processes are those of its pods on its GPU. "": an annotated fraction.
    claim: str = ""
    # The env its CDI device gives it (`NAME=value`), what the audit checks for a claim; None: the webhook's
    # canonical annotations say what it must carry (audit.expected_env).
    written_env: tuple[str, ...] | None = None

    @property
    def mode(self) -> ComputeMode:
        return self.fraction.mode

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.namespace, self.pod_uid, self.container)


class ViolationKind(StrEnum):
    MISSING_LIMIT_ENV = "missing-limit-env"
    LIMIT_ENV_MISMATCH = "limit-env-mismatch"
    MEMORY_OVER_LIMIT = "memory-over-limit"
    WRONG_DEVICE = "wrong-device"
    MIXED_MODES = "mixed-modes"

    @property
    def event_reason(self) -> str:
        return _EVENT_REASONS[self]


_EVENT_REASONS = {
    ViolationKind.MISSING_LIMIT_ENV: "GPULimitEnvMissing",
    ViolationKind.LIMIT_ENV_MISMATCH: "GPULimitEnvMismatch",
    ViolationKind.MEMORY_OVER_LIMIT: "GPUMemoryLimitExceeded",
    ViolationKind.WRONG_DEVICE: "GPUDeviceNotAssigned",
    ViolationKind.MIXED_MODES: "GPUComputeModesMixed",
}


@dataclass(frozen=True)
class EnforcementViolation:
    """What the audit finds a running fraction doing against its limits (the webhook's Violation is a rule a
    request breaks)."""

    kind: ViolationKind
    container: RunningContainer
    gpu_uuid: str
    message: str
    pids: tuple[int, ...] = field(default=(), compare=False)

    @property
    def identity(self) -> tuple[str, ...]:
        """What makes two observations the same violation (the message may carry changing numbers)."""
        c = self.container
        return (self.kind, c.namespace, c.pod, c.pod_uid, c.container, self.gpu_uuid)


@dataclass(frozen=True)
class UsageSample:
    """One metric series set: a container's use of one GPU."""

    namespace: str
    pod: str
    container: str
    gpu_uuid: str
    used_bytes: int
    limit_bytes: int | None
    sm_util: float
    sm_util_normalized: float
