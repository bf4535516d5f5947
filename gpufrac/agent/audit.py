"""Does each GPU process of a fractional container carry its limits and stay within them? Pure.

Inputs are one `Snapshot` of what the agent read: the NVML process list, this node's fractional containers, each
process' cgroup (which names its container) and environment; `decide` turns it into the violations (one per kind,
container and GPU) and the usage series. The agent's loop reads the snapshot and acts on the result.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpufrac.agent.model import EnforcementViolation, GpuInfo, GpuProcess, RunningContainer, UsageSample, ViolationKind
from gpufrac.agent.procfs import container_ids_in_cgroup
from gpufrac.core.contract import (
    MIB,
    LimitEnv,
    format_pinned_mem_limit,
    mib_ceil,
    parse_pinned_mem_limit,
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


@dataclass(frozen=True)
class Findings:
    violations: list[EnforcementViolation]
    usage: list[UsageSample]


def in_fractional_container(cgroup: str, containers: Mapping[str, RunningContainer]) -> bool:
    """Whether a process' cgroup names one of the fractional containers (only those get their environ read)."""
    return any(c in containers for c in container_ids_in_cgroup(cgroup))


def decide(snapshot: Snapshot) -> Findings:
    attributed = attribute(snapshot.processes, snapshot.containers, snapshot.cgroups, snapshot.environs)
    return Findings(audit(attributed, snapshot.gpus), usage(attributed, snapshot.containers.values(), snapshot.gpus))


@dataclass(frozen=True)
class AttributedProcess:
    process: GpuProcess
    container: RunningContainer
    environ: Mapping[str, str] | None  # None: could not be read (the process exited meanwhile)


def attribute(
    processes: Iterable[GpuProcess],
    containers: Mapping[str, RunningContainer],
    cgroups: Mapping[int, str],
    environs: Mapping[int, Mapping[str, str]],
) -> list[AttributedProcess]:
    """Match processes to fractional containers by the container ID in their cgroup; others are dropped."""
    result = []
    for process in processes:
        text = cgroups.get(process.pid)
        if text is None:
            continue
        for container_id in container_ids_in_cgroup(text):
            container = containers.get(container_id)
            if container is not None:
                result.append(AttributedProcess(process, container, environs.get(process.pid)))
                break
    return result


def expected_env(container: RunningContainer) -> dict[str, str | None]:
    """The injected variables a container's processes must carry; None: present, value checked otherwise."""
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
        try:
            ok = parse_pinned_mem_limit(pinned) == spec.pinned_mem_limit_mib
        except ValueError:
            ok = False
        if not ok:
            wrong.append(
                f"{LimitEnv.PINNED_MEM_LIMIT}={pinned} (expected {format_pinned_mem_limit(spec.pinned_mem_limit_mib)})"
            )
    pipe = environ.get(LimitEnv.PIPE_DIRECTORY)
    if pipe is not None and pipe_dir_mode(pipe) is not spec.mode:
        wrong.append(f"{LimitEnv.PIPE_DIRECTORY}={pipe} (expected the {spec.mode} MPS pipe directory)")
    visible = environ.get(LimitEnv.VISIBLE_DEVICES)
    if visible is not None and spec.devices and {d.strip() for d in visible.split(",")} != set(spec.devices):
        wrong.append(f"{LimitEnv.VISIBLE_DEVICES}={visible} (expected {','.join(spec.devices)})")
    return missing, wrong


def device_assigned(devices: Sequence[str], gpu: GpuInfo) -> bool | None:
    """Whether a GPU is among a container's assigned devices; None when the list cannot be compared (MIG)."""
    comparable = False
    for entry in devices:
        value = entry.rpartition("=")[2]  # CDI names end with `=<uuid or index>`
        if value.startswith("MIG-"):
            continue
        comparable = True
        if value == gpu.uuid or value == str(gpu.index):
            return True
    return False if comparable else None


def audit(attributed: Sequence[AttributedProcess], gpus: Mapping[str, GpuInfo]) -> list[EnforcementViolation]:
    violations: list[EnforcementViolation] = []
    by_container_gpu: dict[tuple[tuple[str, str, str], str], list[AttributedProcess]] = defaultdict(list)
    for item in attributed:
        by_container_gpu[(item.container.key, item.process.gpu_uuid)].append(item)

    for (_, gpu_uuid), items in by_container_gpu.items():
        container = items[0].container
        pids = tuple(sorted(i.process.pid for i in items))
        missing: set[str] = set()
        wrong: set[str] = set()
        for item in items:
            if item.environ is not None:
                m, w = env_mismatches(container, item.environ)
                missing.update(m)
                wrong.update(w)
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
        limit = container.fraction.limit_mib
        used = sum(i.process.used_bytes or 0 for i in items)
        if limit is not None and used > limit * MIB:
            violations.append(
                EnforcementViolation(
                    ViolationKind.MEMORY_OVER_LIMIT,
                    container,
                    gpu_uuid,
                    f"container {container.container} uses {mib_ceil(used)} MiB of GPU memory on {gpu_uuid}, "
                    f"over its limit of {limit} MiB",
                    pids,
                )
            )
        gpu = gpus.get(gpu_uuid)
        if (
            gpu is not None
            and container.fraction.devices
            and device_assigned(container.fraction.devices, gpu) is False
        ):
            violations.append(
                EnforcementViolation(
                    ViolationKind.WRONG_DEVICE,
                    container,
                    gpu_uuid,
                    f"container {container.container} runs on GPU {gpu.index} ({gpu_uuid}), which is not "
                    f"among its assigned devices {','.join(container.fraction.devices)}",
                    pids,
                )
            )

    by_gpu: dict[str, dict[tuple[str, str, str], RunningContainer]] = defaultdict(dict)
    for item in attributed:
        by_gpu[item.process.gpu_uuid][item.container.key] = item.container
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
