"""What NodePrepareResources does with one claim: which GPU and mode each allocated device is, the limits it
carries, the per-claim CDI spec, or the refusal that says why the node will not run it. Pure.

The scheduler checked the ResourceSlice's capacity and counters; the node checks again what the allocator is known
to have got wrong on Kubernetes 1.36 (a GPU serving two modes at once, a share not subtracted) and refuses rather
than run a container without its limits. What a claim gets is what an annotated fraction gets from the webhook:
`NVIDIA_GPU_MEMORY_REQUEST`/`_LIMIT` in MiB (the toolkit's memory-limit hook reads them), and where the node serves
the mode through an MPS daemon the pipe directory, the daemons' shared memory, the pinned-memory limit and, for
sm-sharing, the thread percentage. The GPU itself is the toolkit's CDI device where the node's specs name it (so
its hooks run), else its device nodes.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpufrac.agent.decide.claim_holders import CLAIM_CDI_KIND, CLAIM_ENV
from gpufrac.agent.decide.front_door import FrontDoorChoice, refusal_for_claim
from gpufrac.agent.decide.mps_namespaces import Namespace, claim_namespace_name
from gpufrac.agent.dra.decide.claims import (
    AllocatedDevice,
    ClaimAllocation,
    ClaimError,
    ClaimPod,
    ClaimRef,
    limit_for,
    quantity_mib,
)
from gpufrac.agent.dra.decide.slices import (
    CAPACITIES,
    COMPUTE,
    DRIVER,
    MEMORY,
    MODES,
    WHOLE,
    DeviceName,
    SliceGpu,
    parse_device_name,
    pool_name,
)
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import (
    FRONT_DOOR_LABEL,
    SHM_MOUNT_PATH,
    FrontDoor,
    LimitEnv,
    format_pinned_mem_limit_by_uuid,
    mps_pipe_dir,
    mps_shm_dir,
)

CDI_VERSION = "0.6.0"
DRA_DOOR = FrontDoorChoice(FrontDoor.DRA, "the agent's DRA driver")
CDI_KIND = CLAIM_CDI_KIND
TOOLKIT_KINDS = ("nvidia.com/gpu", "k8s.device-plugin.nvidia.com/gpu")  # whose device carries the toolkit's hooks
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


@dataclass(frozen=True)
class DraNode:
    """What the node has, for Prepare."""

    name: str
    gpus: Mapping[int, SliceGpu]  # by NVML index
    mps_root: str
    mps_modes: frozenset[str]  # the modes an MPS daemon serves on this node now
    cdi_devices: frozenset[str]  # the CDI names the node's specs define (`nvidia.com/gpu=GPU-…`)
    host_devices: frozenset[str]  # the control device nodes the host has
    front_door: FrontDoorChoice = DRA_DOOR
    annotated: Mapping[str, str] = field(default_factory=dict)  # GPU UUID -> an annotated fraction placed on it
    unenforced: Mapping[str, str] = field(default_factory=dict)  # mode -> why the node cannot hold its limits now
    plugin_gpus: Mapping[str, str] = field(default_factory=dict)  # GPU UUID -> the device plugin's hold on it
    lost: Mapping[str, str] = field(default_factory=dict)  # GPU UUID -> why it is unhealthy (an XID)
    cdi_problem: str | None = None  # why the runtime would not find the claims' CDI specs (None: it reads them)
    mps_namespaces: bool = False  # the sm-sharing daemon gives each claim an MPS v3 namespace (mps_namespaces)

    def offered(self) -> tuple[str, ...]:
        """The modes the node publishes devices for: those it can hold the limits of, and the whole GPU."""
        return tuple(mode for mode in MODES if mode not in self.unenforced)

    def publishable(self) -> list[SliceGpu]:
        """The GPUs published: not those NVIDIA's device plugin advertises (the kubelet would hand them out twice)."""
        return [gpu for gpu in self.gpus.values() if gpu.gpu.uuid not in self.plugin_gpus]


@dataclass(frozen=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    share_id: str | None
    gpu_index: int
    gpu_uuid: str
    mode: str  # time-slicing, sm-sharing or whole
    request_mib: int
    limit_mib: int
    compute_percent: int
    cdi_ids: tuple[str, ...]
    # The env its CDI device gives (`NAME=value`); () for a whole GPU, and for a share recorded before the agent
    # kept it (its env is then worked out again from the node when its spec is rewritten).
    env: tuple[str, ...] = ()
    admin: bool = False  # adminAccess: the device seen, nothing owed, no tenant


@dataclass(frozen=True)
class PreparedClaim:
    claim: ClaimRef
    devices: tuple[PreparedDevice, ...]
    pods: tuple[ClaimPod, ...] = ()  # whom it was reserved for when prepared


def cdi_device_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def spec_file_name(claim_uid: str) -> str:
    """As NVIDIA's driver names its transient specs: one file per claim, found and removed by the claim's UID."""
    return f"{DRIVER}-claim_{claim_uid}.json"


def _toolkit_device(gpu: SliceGpu, cdi_devices: frozenset[str]) -> str | None:
    for kind in TOOLKIT_KINDS:
        for name in (f"{kind}={gpu.gpu.uuid}", f"{kind}={gpu.gpu.index}"):
            if name in cdi_devices:
                return name
    return None


def _compute(device: AllocatedDevice) -> int:
    text = device.consumed.get(COMPUTE)
    if text is None:
        return 100
    if not text.isdigit() or not 1 <= int(text) <= 100:
        raise ClaimError(f"device {device.device}: consumed compute {text!r} is not a percentage from 1 to 100")
    return int(text)


def _node_refusal(device: AllocatedDevice, parsed: DeviceName, gpu: SliceGpu, node: DraNode) -> str | None:
    """Why this node will not give the device now: its GPU held elsewhere or lost, its mode not enforced."""
    uuid = gpu.gpu.uuid
    if uuid in node.annotated:
        return refusal_for_claim(f"{parsed.index} ({uuid})", f"{node.annotated[uuid]} is placed on it")
    if uuid in node.plugin_gpus:
        return (f"GPU {parsed.index} ({uuid}) is NVIDIA's device plugin's ({node.plugin_gpus[uuid]}): the kubelet "
                "hands it out as a whole GPU, so no claim may share it")
    if uuid in node.lost and not device.admin:
        return f"GPU {parsed.index} ({uuid}) is unhealthy ({node.lost[uuid]}); its devices are tainted"
    unknown = sorted(set(device.consumed) - set(CAPACITIES[parsed.mode]))
    if unknown:
        return (f"consumedCapacity names {unknown}, which a {parsed.mode} device does not publish (it publishes "
                f"{list(CAPACITIES[parsed.mode])})")
    if device.admin:
        return None
    if parsed.mode in node.unenforced:
        return (f"node {node.name} cannot hold a {parsed.mode} claim's limits now ({node.unenforced[parsed.mode]}); "
                "it publishes no such device until it can")
    if parsed.mode == ComputeMode.SM_SHARING and parsed.mode not in node.mps_modes:
        return (f"node {node.name} runs no sm-sharing MPS daemon now, so the claim's compute and memory limits "
                "would not hold")
    return None


def _memory(allocation: ClaimAllocation, device: AllocatedDevice, parsed: DeviceName, gpu: SliceGpu) -> tuple[int, int]:
    """The device's request and limit in MiB; an admin-access view owes nothing and is held to nothing of ours."""
    if device.admin:
        return 0, 0
    consumed = device.consumed.get(MEMORY)
    request = gpu.usable_mib if consumed is None or parsed.mode == WHOLE else quantity_mib(consumed, "consumed memory")
    limit = limit_for(allocation, device.request) or request
    if limit < request or limit > gpu.usable_mib:
        raise ClaimError(f"device {device.device}: the memory limit {limit} MiB must lie between the request "
                         f"{request} MiB and the GPU's usable {gpu.usable_mib} MiB")
    return request, limit


def _one_device(allocation: ClaimAllocation, device: AllocatedDevice, node: DraNode) -> PreparedDevice:
    parsed = parse_device_name(device.device)
    if device.pool != pool_name(node.name) or parsed is None:
        raise ClaimError(f"device {device.pool}/{device.device} is not one this node publishes")
    gpu = node.gpus.get(parsed.index)
    if gpu is None:
        raise ClaimError(f"device {device.device}: GPU {parsed.index} is not on node {node.name} (any more)")
    refusal = _node_refusal(device, parsed, gpu, node)
    if refusal is not None:
        raise ClaimError(f"device {device.device}: {refusal}")
    request, limit = _memory(allocation, device, parsed, gpu)
    toolkit = _toolkit_device(gpu, node.cdi_devices)
    # A whole GPU the toolkit names needs nothing of ours (and CDI refuses a device without edits).
    plain = parsed.mode == WHOLE or device.admin
    cdi = [] if plain and toolkit else [cdi_device_name(allocation.claim.uid, device.device)]
    prepared = PreparedDevice(request=device.request, pool=device.pool, device=device.device,
                              share_id=device.share_id, gpu_index=gpu.gpu.index, gpu_uuid=gpu.gpu.uuid,
                              mode=parsed.mode, request_mib=request, limit_mib=limit,
                              compute_percent=_compute(device) if not plain else 100,
                              cdi_ids=((toolkit,) if toolkit else ()) + tuple(f"{CDI_KIND}={name}" for name in cdi),
                              admin=device.admin)
    return replace(prepared, env=tuple(_env(prepared, node)))


def _conflict(device: PreparedDevice, node: DraNode, others: Iterable[PreparedClaim]) -> str | None:
    """The backstop: a GPU serves one mode (or one whole-GPU claim) at a time, and its shares fit in its memory."""
    if device.admin:
        return None
    held = 0
    for other in others:
        for theirs in other.devices:
            if theirs.gpu_index != device.gpu_index or theirs.admin:
                continue
            if theirs.mode != device.mode or WHOLE in (theirs.mode, device.mode):
                return (f"GPU {device.gpu_index} ({device.gpu_uuid}) serves {theirs.mode} to claim {other.claim}; "
                        f"a {device.mode} claim cannot share it (the scheduler's counter should have kept them apart)")
            held += theirs.request_mib
    usable = node.gpus[device.gpu_index].usable_mib
    if held + device.request_mib > usable:
        return (f"GPU {device.gpu_index} ({device.gpu_uuid}) has {usable - held} MiB left of {usable} MiB for "
                f"prepared claims; this claim asks {device.request_mib} MiB")
    return None


def prepare(allocation: ClaimAllocation, node: DraNode, others: Iterable[PreparedClaim]) -> PreparedClaim:
    """The claim's devices, checked; ClaimError (one line) when the node refuses it."""
    if node.front_door.door is not FrontDoor.DRA:
        raise ClaimError(f"node {node.name} hands its GPUs out through annotations ({node.front_door.why}), not "
                         f"through DRA: label it {FRONT_DOOR_LABEL}={FrontDoor.DRA} to serve claims (docs/dra.md)")
    if node.cdi_problem is not None:
        raise ClaimError(f"node {node.name}: {node.cdi_problem}")
    devices = tuple(_one_device(allocation, device, node) for device in allocation.devices)
    shares = [d for d in devices if d.mode != WHOLE]
    if shares and len(devices) > 1:
        raise ClaimError(f"claim {allocation.claim} has {len(devices)} devices and a share among them: a container "
                         "takes one fractional GPU per claim (its limit env names one GPU)")
    others = [o for o in others if o.claim.uid != allocation.claim.uid]
    for device in devices:
        problem = _conflict(device, node, others)
        if problem:
            raise ClaimError(problem)
    return PreparedClaim(allocation.claim, devices, allocation.pods)


def _own_device_nodes(device: PreparedDevice) -> bool:
    """No toolkit device names this GPU: the claim's spec gives its device nodes, and the env NVIDIA's runtime
    reads."""
    return all(cdi.startswith(CDI_KIND + "=") for cdi in device.cdi_ids)


def _env(device: PreparedDevice, node: DraNode) -> list[str]:
    visible = {LimitEnv.VISIBLE_DEVICES: device.gpu_uuid} if _own_device_nodes(device) else {}
    if device.mode == WHOLE or device.admin:
        return [f"{key}={value}" for key, value in visible.items()]
    env = {LimitEnv.MEMORY_REQUEST: str(device.request_mib), LimitEnv.MEMORY_LIMIT: str(device.limit_mib)}
    if device.mode in node.mps_modes:
        env[LimitEnv.PIPE_DIRECTORY] = mps_pipe_dir(node.mps_root, ComputeMode(device.mode))
        # keyed by UUID: an index key names a GPU a narrowed CUDA_VISIBLE_DEVICES may hide, and CUDA then drops it
        env[LimitEnv.PINNED_MEM_LIMIT] = format_pinned_mem_limit_by_uuid(device.limit_mib, [device.gpu_uuid])
        if device.mode == ComputeMode.SM_SHARING:
            env[LimitEnv.ACTIVE_THREAD_PERCENTAGE] = str(device.compute_percent)
    return [f"{key}={value}" for key, value in (env | visible).items()]


def _pipe_host_dir(device: PreparedDevice, node: DraNode, claim: ClaimRef) -> str:
    """What the container gets as its pipe directory: an sm-sharing claim's own MPS namespace where the daemon gives
    one (its one socket, no daemon's control socket), else the mode daemon's directory."""
    pipe = mps_pipe_dir(node.mps_root, ComputeMode(device.mode))
    if device.mode != ComputeMode.SM_SHARING or not node.mps_namespaces:
        return pipe
    name = claim_namespace_name(claim.namespace, f"{claim.name}/{device.request}")
    return posixpath.join(pipe, str(Namespace(name, 0, 0, "").pipe_subdir))


def _edits(device: PreparedDevice, node: DraNode, claim: ClaimRef) -> dict[str, Any]:
    edits: dict[str, Any] = {}
    env = list(device.env) or _env(device, node)
    if device.mode == ComputeMode.TIME_SLICING and not device.admin:
        env.append(f"{CLAIM_ENV}={claim.uid}")
    if _own_device_nodes(device):
        edits["deviceNodes"] = [{"path": path} for path in
                                (f"/dev/nvidia{device.gpu_index}", *sorted(node.host_devices))]
    if env:
        edits["env"] = env
    if device.mode != WHOLE and not device.admin and device.mode in node.mps_modes:
        pipe = mps_pipe_dir(node.mps_root, ComputeMode(device.mode))
        edits["mounts"] = [
            {"hostPath": _pipe_host_dir(device, node, claim), "containerPath": pipe,
             "options": ["rbind", "rw", "nosuid", "nodev"]},
            {"hostPath": mps_shm_dir(node.mps_root), "containerPath": SHM_MOUNT_PATH,
             "options": ["rbind", "rw", "nosuid", "nodev"]},
        ]
    return edits


def own_cdi_id(device: PreparedDevice) -> str | None:
    """The device's name in the claim's spec, if it has one there."""
    return next((cdi.split("=", 1)[1] for cdi in device.cdi_ids if cdi.startswith(CDI_KIND + "=")), None)


def cdi_spec(prepared: PreparedClaim, node: DraNode) -> dict[str, Any] | None:
    """The claim's CDI spec: a device `<claim uid>-<device>` per allocated device that needs edits of ours; None
    when none does (whole GPUs the toolkit's spec names)."""
    devices = [{"name": name, "containerEdits": _edits(device, node, prepared.claim)}
               for device in prepared.devices if (name := own_cdi_id(device)) is not None]
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": devices} if devices else None


def control_devices(existing: Iterable[str]) -> frozenset[str]:
    """The control device nodes a client needs, of those the host has."""
    have = {posixpath.normpath(path) for path in existing}
    return frozenset(path for path in CONTROL_DEVICES if path in have)
