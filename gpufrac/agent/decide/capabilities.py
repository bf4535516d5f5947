"""What a node can enforce, from inventory and daemon health: node labels and the Ready condition. Pure."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

from gpufrac.agent.decide.model import ConditionStatus, DaemonState, DaemonStatus, Inventory, NodeCondition
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import Enforcement, enforcement_label

DRIVER_MAJOR_LABEL = "gpufrac.io/driver-version.major"
GPU_COUNT_LABEL = "gpufrac.io/gpu-count"
CONDITION_TYPE = "gpufrac.io/Ready"
# Published with gpufrac.io/Ready's status by default: KAI's NvFractions mode places fractions only where its node
# condition is True, and KAI's releases name it differently (its gpu-sharing docs and operator the first; its
# scheduler's NvFractionNodeReadyConditionType, read by its gpusharingnodevalidation predicate, the second).
KAI_CONDITION_TYPES = ("gpu-sharing.nvidia.com/Ready", "gpu-fractioning.nvidia.com/Ready")

# CUDA 13.4 memory limits need driver r615+ and a CUDA driver API of 13.4 (13040) or later.
MIN_DRIVER_MAJOR = 615
MIN_CUDA_DRIVER_VERSION = 13040

NRI_UNAVAILABLE = "NriUnavailable"  # the reason while the agent's NRI plugin cannot reach the runtime
# Time-slicing is not enforceable with this driver: the reason of a False condition when no enabled mode is, of a
# True one when sm-sharing is (MPS's pinned memory limits work on any MPS driver), so KAI still places fractions.
DRIVER_WITHOUT_LIMITS = "DriverWithoutMemoryLimits"


def ready_condition_types(values: list[str] | None) -> tuple[str, ...]:
    """The types published beside gpufrac.io/Ready, from the repeatable --ready-condition-type (None: not given,
    both of KAI's; '' entries dropped, so `--ready-condition-type ''` is none)."""
    if values is None:
        return KAI_CONDITION_TYPES
    return tuple(v.strip() for v in values if v.strip())


def driver_major(version: str) -> int | None:
    match = re.match(r"^\s*(\d+)", version)
    return int(match[1]) if match else None


def has_driver_memory_limits(inventory: Inventory) -> bool:
    major = driver_major(inventory.driver_version)
    return (
        major is not None
        and major >= MIN_DRIVER_MAJOR
        and inventory.cuda_driver_version >= MIN_CUDA_DRIVER_VERSION
    )


def cuda_version_text(version: int) -> str:
    return f"{version // 1000}.{(version % 1000) // 10}"


def modes_to_serve(inventory: Inventory, enabled: Collection[ComputeMode]) -> tuple[ComputeMode, ...]:
    """The modes that get an MPS control daemon on this node.

    Without driver memory limits, time-slicing gets none: a legacy MPS server shares one context between its
    clients, which would silently turn time-slicing into sm-sharing.
    """
    if not inventory.gpus:
        return ()
    if has_driver_memory_limits(inventory):
        return tuple(m for m in ComputeMode if m in enabled)
    return tuple(m for m in (ComputeMode.SM_SHARING,) if m in enabled)


def enforcement(
    inventory: Inventory, enabled: Collection[ComputeMode], daemons: Mapping[ComputeMode, DaemonStatus],
    cgroup_unable: str | None = None,
) -> dict[ComputeMode, Enforcement]:
    """Per mode, what is really enforced right now. Never claims more than the node has: `driver` only where the
    driver holds a memory limit on a container's cgroup, as the agent's probe set and read one back (`cgroup_unable`:
    why it does not, None: it does), since that limit is the driver's only one (NVIDIA: the toolkit's hook sets it)."""
    result = dict.fromkeys(ComputeMode, Enforcement.NONE)
    if not inventory.gpus:
        return result
    driver = has_driver_memory_limits(inventory) and cgroup_unable is None

    def daemon_up(mode: ComputeMode) -> bool:
        status = daemons.get(mode)
        return status is not None and status.up

    if ComputeMode.TIME_SLICING in enabled and driver:
        # memory limits come from the driver; time-slicing needs no shared server to work
        result[ComputeMode.TIME_SLICING] = Enforcement.DRIVER
    if ComputeMode.SM_SHARING in enabled and daemon_up(ComputeMode.SM_SHARING):
        # sm-sharing exists only while its shared MPS server is up
        result[ComputeMode.SM_SHARING] = Enforcement.DRIVER if driver else Enforcement.MPS
    return result


def node_labels(inventory: Inventory | None, enforced: Mapping[ComputeMode, Enforcement]) -> dict[str, str]:
    labels = {enforcement_label(mode): str(enforced.get(mode, Enforcement.NONE)) for mode in ComputeMode}
    if inventory is not None:
        major = driver_major(inventory.driver_version)
        if major is not None:
            labels[DRIVER_MAJOR_LABEL] = str(major)
        labels[GPU_COUNT_LABEL] = str(len(inventory.gpus))
    return labels


def version_skew(own_build: str, daemons: Mapping[ComputeMode, DaemonStatus]) -> dict[ComputeMode, str]:
    """The modes whose MPS daemon is supervised by another gpufrac build than the agent's (an MPS pod that a `helm
    upgrade` left on its old image: the DaemonSet is OnDelete), each with that build."""
    return {mode: status.build for mode, status in daemons.items()
            if status.build is not None and status.build != own_build}


def skew_message(own_build: str, skew: Mapping[ComputeMode, str]) -> str:
    pods = ", ".join(f"the {mode} MPS pod runs gpufrac {skewed}" for mode, skewed in sorted(skew.items()))
    return (f"{pods}, the agent gpufrac {own_build}: replace the node's MPS pod when its fractional pods allow "
            "(gpufrac mps-roll; docs/operations.md)")


def node_condition(
    inventory: Inventory | None,
    enabled: Collection[ComputeMode],
    enforced: Mapping[ComputeMode, Enforcement],
    daemons: Mapping[ComputeMode, DaemonStatus],
    *,
    nvml_error: str | None = None,
    memory_problem: str | None = None,
    delivery_problem: str | None = None,
    skew: str | None = None,
    runtime_problems: Sequence[tuple[str, str]] = (),
    daemon_side: str | None = None,
    front_door: str | None = None,
    reclaim: str | None = None,
    blocking: Sequence[tuple[str, str]] = (),
    remarks: Sequence[tuple[str, str]] = (),
    cgroup_unable: str | None = None,
) -> NodeCondition:
    """The gpufrac.io/Ready condition: True when every enabled mode is enforced, or every one this driver can
    enforce (a pre-r615 driver: sm-sharing, not time-slicing, whose fractions the NRI plugin then refuses).

    The reason is the most important problem; the message lists all of them, each with what to do. A delivery
    problem (the runtime has no NRI socket, so the agent's NRI plugin hands out no devices) keeps the limits
    enforced, so it does not make the condition False: it is the reason of a True condition, and its message says so.
    A version skew (`skew`: what skew_message says) is no problem for enforcement either: the reason of a True
    condition when there is no delivery problem, and in the message. `runtime_problems` (containerd < 2.1, a GPU
    no CDI spec names: runtime_support.runtime_problems) make it False: fractions there get no working GPU.
    `daemon_side` (mps_limits.holds: what the sm-sharing daemon's own limits do not hold) is said on a True condition:
    each container's limits still hold through its client env and the agent's container total. So is `front_door`
    (front_door.choose's problem: the node's front-door label cannot be followed, the default is), and `reclaim`
    (soft_limits.reclaim_note: whether the driver or the agent takes back memory above a request). `blocking`
    (reason, message) make it False before anything else (the agent stands down: KAI's gpu-fractioning operator on
    the node; no NRI without the env fallback); `remarks` (reason, message) are said on a True condition, the first
    one's reason where nothing above names one (a webhook of another minor version).
    """
    if inventory is None:
        return _condition([(
            "NvmlUnavailable",
            f"NVML is not available ({nvml_error or 'unknown error'}): no GPU can be inspected; "
            "check that the NVIDIA driver is loaded and the agent runs with the NVIDIA runtime",
        )])
    if not inventory.gpus:
        return _condition([("NoGpus", "NVML reports no GPUs on this node; check the driver and device nodes")])
    gap = _driver_gap(inventory, enabled, cgroup_unable)
    # the driver blocks the node only where it leaves no enabled mode to enforce
    driver = [(DRIVER_WITHOUT_LIMITS, gap)] if gap and not enforceable(inventory, enabled, cgroup_unable) else []
    problems = [
        *blocking,
        *_failed_daemons(daemons),
        *runtime_problems,  # the delivery path's (runtime_support.runtime_problems): no working GPU for fractions
        *([("MpsMemoryBudgetTooSmall", memory_problem)] if memory_problem else []),
        *driver,
        *_waiting_daemons(inventory, enabled, daemons),
    ]
    if problems:
        also = [(DRIVER_WITHOUT_LIMITS, gap)] if gap and not driver else []  # said, though it blocks nothing
        told = any(reason == NRI_UNAVAILABLE for reason, _ in blocking)
        delivery = [(NRI_UNAVAILABLE, delivery_problem)] if delivery_problem and not told else []
        return _condition(problems + also + delivery)
    summary = ", ".join(f"{mode}: {enforced.get(mode, Enforcement.NONE)}" for mode in ComputeMode
                        if mode in enabled and enforced.get(mode, Enforcement.NONE) is not Enforcement.NONE)
    enforced_text = f"GPU memory fractions are enforced ({summary}) on {len(inventory.gpus)} GPU(s)"
    notes = [f"not {ComputeMode.TIME_SLICING}: {gap}"] if gap else []
    notes += [f"but {delivery_problem}"] if delivery_problem else []
    notes += [skew] if skew else []
    notes += [daemon_side] if daemon_side else []
    notes += [front_door] if front_door else []
    notes += [reclaim] if reclaim else []
    notes += [message for _, message in remarks]
    reason = (NRI_UNAVAILABLE if delivery_problem else DRIVER_WITHOUT_LIMITS if gap else
              "MpsVersionSkew" if skew else remarks[0][0] if remarks else "FractionsEnforced")
    return NodeCondition(ConditionStatus.TRUE, reason, "; ".join([enforced_text, *notes]))


def _failed_daemons(daemons: Mapping[ComputeMode, DaemonStatus]) -> list[tuple[str, str]]:
    return [
        (
            "MpsDaemonFailed",
            f"the {mode} MPS control daemon {status.failure or 'failed'}; {mode} fractions "
            "cannot be served on this node; see its control.log, fix the cause and restart the "
            "gpufrac agent pod",
        )
        for mode in ComputeMode
        if (status := daemons.get(mode)) is not None and status.state is DaemonState.FAILED
    ]


def enforceable(inventory: Inventory, enabled: Collection[ComputeMode],
                cgroup_unable: str | None = None) -> tuple[ComputeMode, ...]:
    """The served modes this node can enforce: time-slicing only where the driver holds a cgroup limit."""
    return tuple(m for m in modes_to_serve(inventory, enabled)
                 if not (m is ComputeMode.TIME_SLICING and cgroup_unable is not None))


def _driver_gap(inventory: Inventory, enabled: Collection[ComputeMode], cgroup_unable: str | None = None) -> str | None:
    """Why time-slicing, enabled, cannot be enforced with this driver, or on this node's cgroups (None: it can, or it
    is not enabled)."""
    if ComputeMode.TIME_SLICING not in enabled:
        return None
    if has_driver_memory_limits(inventory):
        return None if cgroup_unable is None else (
            f"the driver holds no memory limit on a container's cgroup here ({cgroup_unable}), the only limit it "
            "has for time-slicing: time-slicing fractions cannot be enforced on this node and are refused here "
            f"(node label {enforcement_label(ComputeMode.TIME_SLICING)}=none); run the node on cgroup v2 with the "
            "dmem controller (kernel 6.14+)")
    return (f"driver {inventory.driver_version} (CUDA {cuda_version_text(inventory.cuda_driver_version)}) has no "
            "CUDA 13.4 memory limits: time-slicing fractions cannot be enforced on this node and are refused here "
            f"(node label {enforcement_label(ComputeMode.TIME_SLICING)}=none); upgrade to r{MIN_DRIVER_MAJOR}+")


def _waiting_daemons(inventory: Inventory, enabled: Collection[ComputeMode],
                     daemons: Mapping[ComputeMode, DaemonStatus]) -> list[tuple[str, str]]:
    """Served modes whose daemon is restarting with backoff, or not up yet."""
    problems = []
    for mode in modes_to_serve(inventory, enabled):
        status = daemons.get(mode)
        if status is not None and status.state is DaemonState.BACKOFF:
            problems.append(
                (
                    "MpsDaemonRestarting",
                    f"the {mode} MPS control daemon {status.last_exit or 'exited'} and is being restarted with "
                    f"backoff; {mode} fractions wait for it; if it keeps exiting, see its control.log",
                )
            )
        elif status is None or (status.state is not DaemonState.FAILED and not status.up):
            problems.append(
                (
                    "MpsDaemonNotReady",
                    f"the {mode} MPS control daemon is not up yet"
                    f"{f' ({status.state})' if status else ''}; {mode} fractions wait for it"
                    f"{f'; it {status.last_exit}' if status and status.last_exit else ''}",
                )
            )
    return problems


def _condition(problems: list[tuple[str, str]]) -> NodeCondition:
    return NodeCondition(ConditionStatus.FALSE, problems[0][0], "; ".join(message for _, message in problems))


def stopped_condition() -> NodeCondition:
    return NodeCondition(
        ConditionStatus.UNKNOWN,
        "AgentStopped",
        "the gpufrac agent on this node stopped: enforcement is not being checked; "
        "check the gpufrac agent DaemonSet pod on this node",
    )


def unserved_reason(
    mode: ComputeMode,
    inventory: Inventory | None,
    enabled: Collection[ComputeMode],
    enforced: Mapping[ComputeMode, Enforcement],
    daemons: Mapping[ComputeMode, DaemonStatus],
    cgroup_unable: str | None = None,
) -> str | None:
    """Why this node cannot hand a pod the mode's MPS directories right now (None: it can). For the CSI plugin."""
    if mode not in enabled:
        return f"the gpufrac agent here does not serve {mode} (its --modes)"
    if inventory is None:
        return "NVML is not available, so no GPU can be inspected"
    if not inventory.gpus:
        return "NVML reports no GPUs"
    if mode not in modes_to_serve(inventory, enabled):
        return (
            f"driver {inventory.driver_version} has no CUDA 13.4 memory limits (r{MIN_DRIVER_MAJOR}+ needed), so "
            f"{mode} gets no MPS daemon"
        )
    status = daemons.get(mode)
    if status is None or not status.up:
        state = "not started" if status is None else str(status.state)
        return f"its MPS control daemon is {state}{f' ({status.failure})' if status and status.failure else ''}"
    if enforced.get(mode, Enforcement.NONE) is Enforcement.NONE:
        gap = _driver_gap(inventory, enabled, cgroup_unable) if mode is ComputeMode.TIME_SLICING else None
        return gap or "its memory limits are not enforced"
    return None
