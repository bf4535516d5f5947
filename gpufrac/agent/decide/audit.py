"""Does each GPU process of a fractional container carry its limits and stay within them? Pure.

Inputs are one `Snapshot` of what the agent read: the NVML process list, this node's fractional containers, each
process' cgroup (which names its container) and environment; `decide` turns it into the violations (one per kind,
container and GPU) and the usage series. The agent's loop reads the snapshot and acts on the result.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpufrac.agent.decide.attribution import AttributedProcess, attribute
from gpufrac.agent.decide.claim_tenants import ClaimTenants
from gpufrac.agent.decide.model import (
    EnforcementViolation,
    GpuInfo,
    GpuProcess,
    RunningContainer,
    UsageSample,
    ViolationKind,
)
from gpufrac.core.annotations import device_id
from gpufrac.core.contract import (
    MIB,
    NO_GPU_VALUES,
    LimitEnv,
    format_pinned_mem_limit,
    mib_ceil,
    pinned_limit_agrees,
    pipe_dir_mode,
)


@dataclass(frozen=True)
class Snapshot:
    """Everything one audit reads, taken at once (the agent's observe step)."""

    processes: Sequence[GpuProcess]
    containers: Mapping[str, RunningContainer]  # by container ID
    cgroups: Mapping[int, str]  # pid -> /proc/<pid>/cgroup; missing: unreadable
    environs: Mapping[int, Mapping[str, str]]  # pid -> environment, of processes in fractional containers
    gpus: Mapping[str, GpuInfo]  # by UUID
    claims: ClaimTenants = field(default_factory=ClaimTenants)  # the DRA driver's prepared shares
    # (container ID, GPU) -> what holds that container's memory there (the driver's cgroup limit, MPS, its env)
    held_by: Mapping[tuple[str, str], str] = field(default_factory=dict)

    def tenants(self) -> list[RunningContainer]:
        """Every fractional container and claim share the snapshot knows."""
        return [*self.containers.values(), *self.claims.tenants]


@dataclass(frozen=True)
class Findings:
    violations: list[EnforcementViolation]
    usage: list[UsageSample]
    attributed: list[AttributedProcess] = field(default_factory=list)  # the processes of fractional containers


def decide(snapshot: Snapshot) -> Findings:
    attributed = attribute(snapshot.processes, snapshot.containers, snapshot.cgroups, snapshot.environs,
                           snapshot.claims)
    return Findings(audit(attributed, snapshot.gpus, snapshot.held_by),
                    usage(attributed, snapshot.tenants(), snapshot.gpus), attributed)


# Checked apart (env_mismatches): the pinned limit may be keyed by index or UUID, the devices by CDI's `void`.
_CHECKED_APART = frozenset({LimitEnv.PINNED_MEM_LIMIT, LimitEnv.VISIBLE_DEVICES})


def expected_env(container: RunningContainer) -> dict[str, str | None]:
    """The injected variables a container's processes must carry; None: present, value checked otherwise. A
    claim's share must carry what its CDI device gives."""
    if container.written_env is not None:
        written = (entry.partition("=") for entry in container.written_env)
        return {name: None if name in _CHECKED_APART else value for name, _, value in written}
    spec = container.fraction
    expected: dict[str, str | None] = {LimitEnv.PIPE_DIRECTORY: None}
    if spec.limit_mib is not None:
        expected[LimitEnv.MEMORY_LIMIT] = str(spec.limit_mib)
    if spec.request_mib is not None:
        expected[LimitEnv.MEMORY_REQUEST] = str(spec.request_mib)
    if spec.pinned_mem_limit_mib:
        expected[LimitEnv.PINNED_MEM_LIMIT] = None
    if spec.devices:
        expected[LimitEnv.VISIBLE_DEVICES] = None
    if spec.active_thread_percent is not None:
        expected[LimitEnv.ACTIVE_THREAD_PERCENTAGE] = str(spec.active_thread_percent)
    return expected


def env_mismatches(container: RunningContainer, environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(missing names, `NAME=value (expected …)` descriptions of wrong values)."""
    spec = container.fraction
    missing, wrong = [], []
    for name, value in expected_env(container).items():
        actual = environ.get(name)
        if actual is None:
            missing.append(name)
        elif value is not None and actual.strip() != value:
            wrong.append(f"{name}={actual} (expected {value})")
    pinned = environ.get(LimitEnv.PINNED_MEM_LIMIT)
    if pinned is not None and spec.pinned_mem_limit_mib:
        own = tuple(d for d in map(device_id, spec.devices) if d.startswith("GPU-"))  # by identity, where known
        if not pinned_limit_agrees(pinned, spec.pinned_mem_limit_mib, own):  # by index, or by UUID (the NRI plugin's)
            wrong.append(
                f"{LimitEnv.PINNED_MEM_LIMIT}={pinned} (expected {format_pinned_mem_limit(spec.pinned_mem_limit_mib)})"
            )
    pipe = environ.get(LimitEnv.PIPE_DIRECTORY)
    if pipe is not None and pipe_dir_mode(pipe) is not spec.mode:
        wrong.append(f"{LimitEnv.PIPE_DIRECTORY}={pipe} (expected the {spec.mode} MPS pipe directory)")
    visible = environ.get(LimitEnv.VISIBLE_DEVICES)
    # `void`: the GPUs came as CDI devices (the agent's NRI plugin), whose NVIDIA specs set it so that NVIDIA's hook
    # does not inject them a second time; which GPU a process uses is checked by its device, not by this env
    if visible is not None and spec.devices and visible.strip() not in NO_GPU_VALUES and \
            {device_id(d.strip()) for d in visible.split(",")} != {device_id(d) for d in spec.devices}:
        wrong.append(f"{LimitEnv.VISIBLE_DEVICES}={visible} (expected {','.join(spec.devices)})")
    return missing, wrong


def device_assigned(devices: Sequence[str], gpu: GpuInfo) -> bool | None:
    """Whether a GPU is among a container's assigned devices; None when the list cannot be compared (MIG)."""
    comparable = False
    for entry in devices:
        value = device_id(entry)
        if value.startswith("MIG-"):
            continue
        comparable = True
        if value == gpu.uuid or value == str(gpu.index):
            return True
    return False if comparable else None


def audit(attributed: Sequence[AttributedProcess], gpus: Mapping[str, GpuInfo],
          held_by: Mapping[tuple[str, str], str] | None = None) -> list[EnforcementViolation]:
    """Each container's processes on each GPU against its pod's annotations (env, memory, devices), then each GPU
    against the modes it hosts."""
    by_container_gpu: dict[tuple[tuple[str, str, str], str], list[AttributedProcess]] = defaultdict(list)
    for item in attributed:
        by_container_gpu[(item.container.key, item.process.gpu_uuid)].append(item)
    violations: list[EnforcementViolation] = []
    for (_, gpu_uuid), items in by_container_gpu.items():
        violations += _env_violations(gpu_uuid, items)
        violations += _memory_violations(gpu_uuid, items, (held_by or {}).get((items[0].container.container_id,
                                                                                gpu_uuid)))
        violations += _device_violations(gpus.get(gpu_uuid), gpu_uuid, items)
    return violations + _mixed_modes(attributed)


def _pids_of(items: Sequence[AttributedProcess]) -> tuple[int, ...]:
    return tuple(sorted(i.process.pid for i in items))


def _env_violations(gpu_uuid: str, items: Sequence[AttributedProcess]) -> list[EnforcementViolation]:
    """Limit env missing from, or differing in, the processes' environment (where /proc let it be read)."""
    container, pids = items[0].container, _pids_of(items)
    missing: set[str] = set()
    wrong: set[str] = set()
    for item in items:
        if item.environ is not None:
            m, w = env_mismatches(container, item.environ)
            missing.update(m)
            wrong.update(w)
    violations = []
    if missing:
        violations.append(
            EnforcementViolation(
                ViolationKind.MISSING_LIMIT_ENV,
                container,
                gpu_uuid,
                f"container {container.container} runs GPU process(es) {_pids(pids)} on {gpu_uuid} "
                f"without {', '.join(sorted(missing))}: its GPU limits are not applied; recreate the "
                "pod so the gpufrac webhook can inject them",
                pids,
            )
        )
    if wrong:
        violations.append(
            EnforcementViolation(
                ViolationKind.LIMIT_ENV_MISMATCH,
                container,
                gpu_uuid,
                f"container {container.container} runs GPU process(es) {_pids(pids)} with limits that "
                f"differ from its pod's annotations: {'; '.join(sorted(wrong))}",
                pids,
            )
        )
    return violations


def _memory_violations(gpu_uuid: str, items: Sequence[AttributedProcess],
                       held: str | None = None) -> list[EnforcementViolation]:
    """The container's processes on one GPU together above its limit; `held`: what was to hold it there."""
    container = items[0].container
    limit = container.fraction.limit_mib
    used = sum(i.process.used_bytes or 0 for i in items)
    if limit is None or used <= limit * MIB:
        return []
    # MPS pins the limit per client process: two processes under it each can hold twice it together
    each = ", ".join(
        f"{i.process.pid} ({mib_ceil(i.process.used_bytes or 0)} MiB)"
        for i in sorted(items, key=lambda i: i.process.pid)
    )
    return [
        EnforcementViolation(
            ViolationKind.MEMORY_OVER_LIMIT,
            container,
            gpu_uuid,
            f"container {container.container} uses {mib_ceil(used)} MiB of GPU memory on {gpu_uuid}, "
            f"over its limit of {limit} MiB, in total over its process(es) {each}"
            + (f"; what holds it: {held}" if held else ""),
            _pids_of(items),
        )
    ]


def _device_violations(gpu: GpuInfo | None, gpu_uuid: str,
                       items: Sequence[AttributedProcess]) -> list[EnforcementViolation]:
    """The container runs on a GPU that is not among its assigned devices."""
    container = items[0].container
    if gpu is None or not container.fraction.devices or device_assigned(container.fraction.devices, gpu) is not False:
        return []
    return [
        EnforcementViolation(
            ViolationKind.WRONG_DEVICE,
            container,
            gpu_uuid,
            f"container {container.container} runs on GPU {gpu.index} ({gpu_uuid}), which is not "
            f"among its assigned devices {','.join(container.fraction.devices)}",
            _pids_of(items),
        )
    ]


def _mixed_modes(attributed: Sequence[AttributedProcess]) -> list[EnforcementViolation]:
    """Every container on a GPU that hosts both modes."""
    by_gpu: dict[str, dict[tuple[str, str, str], RunningContainer]] = defaultdict(dict)
    for item in attributed:
        by_gpu[item.process.gpu_uuid][item.container.key] = item.container
    violations = []
    for gpu_uuid, containers in by_gpu.items():
        modes = {c.mode for c in containers.values()}
        if len(modes) < 2:
            continue
        who = ", ".join(
            sorted(f"{c.namespace}/{c.pod}/{c.container} ({c.mode})" for c in containers.values())
        )
        for container in containers.values():
            violations.append(
                EnforcementViolation(
                    ViolationKind.MIXED_MODES,
                    container,
                    gpu_uuid,
                    f"GPU {gpu_uuid} hosts both time-slicing and sm-sharing fractions ({who}): the modes "
                    "must not share a GPU; the scheduler placed them together",
                )
            )
    return violations


def usage(
    attributed: Sequence[AttributedProcess],
    running: Iterable[RunningContainer],
    gpus: Mapping[str, GpuInfo],
) -> list[UsageSample]:
    """Per container and GPU: memory used and limit, SM utilization, and utilization ÷ fraction.

    A running container's assigned GPUs on this node get a zero series even with no process yet.
    """
    keys: dict[tuple[tuple[str, str, str], str], tuple[RunningContainer, list[GpuProcess]]] = {}
    for container in running:
        for gpu in gpus.values():
            if container.fraction.devices and device_assigned(container.fraction.devices, gpu):
                keys.setdefault((container.key, gpu.uuid), (container, []))
    for item in attributed:
        keys.setdefault((item.container.key, item.process.gpu_uuid), (item.container, []))[1].append(
            item.process
        )
    samples = []
    for (_, gpu_uuid), (container, processes) in keys.items():
        used = sum(p.used_bytes or 0 for p in processes)
        util = min(100.0, float(sum(p.sm_util or 0 for p in processes)))
        spec = container.fraction
        device = gpus.get(gpu_uuid)
        share_mib = spec.request_mib if spec.request_mib is not None else spec.limit_mib
        fraction = share_mib / device.memory_total_mib if device and share_mib and device.memory_total_mib else 1.0
        samples.append(
            UsageSample(
                namespace=container.namespace,
                pod=container.pod,
                container=container.container,
                gpu_uuid=gpu_uuid,
                used_bytes=used,
                limit_bytes=spec.limit_mib * MIB if spec.limit_mib is not None else None,
                sm_util=util,
                sm_util_normalized=min(100.0, util / min(fraction, 1.0)),
            )
        )
    return samples


def _pids(pids: Sequence[int]) -> str:
    return ",".join(map(str, pids))
