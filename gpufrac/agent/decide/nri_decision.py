"""What a container gets from gpufrac when the runtime creates it (the NRI plugin's CreateContainer). Pure.

Inputs are plain values: the pod's annotations (NRI hands the plugin the sandbox's, which are the pod's), the
container's name and env, and what the node has (`NodeFacts`: its GPUs, the CDI devices its specs name, its GPU
device nodes, the modes it enforces now, which GPU serves which mode to running containers). `decide` returns
an `Injection` (what to add or take away) or a `Refusal` (the runtime fails the creation with its message).

- A fractional container (canonical `gpufrac.io/container.<c>.*` annotations, written by the webhook) gets exactly
  the devices its `nvidia.com/container.<c>.gpus.devices` names: CDI devices where the node's CDI specs name them
  (a UUID or index is looked up under NVIDIA's kinds; a CDI name is used as written), device nodes otherwise, with
  the control devices. Its limit env, which the kubelet resolved from the annotations, must match them: a
  mismatch is refused, not corrected.
- Every other container gets no GPU from gpufrac, and an env grant (`NVIDIA_VISIBLE_DEVICES=all`, ...) is voided:
  `NVIDIA_VISIBLE_DEVICES=void` (NVIDIA's runtime reads "no GPU"; an unset variable would let its legacy mode
  give a CUDA image every GPU), the MIG and IMEX grants removed. CDI devices another component (a device plugin)
  put into the container are left to it. Pods in trusted namespaces (the GPU stack's own: the device plugin, DCGM,
  gpufrac's agent and MPS daemons, which hold every GPU through that env) keep their env, and the policy can leave
  env grants alone everywhere (`Policy.void_env_grants`).
- Refused: a fraction without the canonical annotations (the webhook was bypassed), one whose canonical values do
  not parse, one with no bound GPU or no memory limit, a mode the node does not enforce now, a device the node does
  not have, a GPU serving the other compute mode to a running container of another pod.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gpufrac.agent.decide.audit import env_mismatches
from gpufrac.agent.decide.model import GpuInfo, RunningContainer
from gpufrac.core.annotations import (
    CANONICAL_PREFIX,
    SHORTHAND_KEYS,
    ComputeMode,
    Field,
    MalformedKeyError,
    device_id,
    is_fraction_key,
    nvidia_key,
    parse_container_key,
)
from gpufrac.core.contract import NO_GPU, NO_GPU_VALUES, CanonicalFraction, LimitEnv, read_canonical

# NVIDIA's CDI kinds, most preferred first: the device plugin's (KAI's binder writes it into gpus.devices on CDI
# clusters; its device carries the hook that applies the CUDA 13.4 memory limit), then the toolkit's.
CDI_KINDS = ("k8s.device-plugin.nvidia.com/gpu", "nvidia.com/gpu")
# The device nodes every GPU client needs besides its GPU's own /dev/nvidia<N> (those the host has are given).
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
GPU_DEVICE_PREFIX = "/dev/nvidia"
# Env names NVIDIA's runtime reads as a grant of GPUs (or of MIG / IMEX capabilities) in a container.
GRANT_ENV_REMOVED = ("NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES", "NVIDIA_IMEX_CHANNELS")


class Outcome(StrEnum):
    """What the plugin did with one container: the `outcome` label of its metric."""

    INJECTED = "injected"  # a fraction: its GPU devices handed out
    VOIDED = "voided"  # not a fraction, and its env asked for a GPU: voided
    UNTOUCHED = "untouched"  # not a fraction, asked for nothing
    REFUSED = "refused"


@dataclass(frozen=True)
class DeviceNode:
    """A host character device, as the runtime adds it to a container (and allows it in the device cgroup)."""

    path: str
    major: int
    minor: int
    file_mode: int = 0o666


@dataclass(frozen=True)
class ServingContainer:
    """A created or running fractional container and the GPUs (UUIDs) it was given: who holds a GPU's mode."""

    container_id: str
    namespace: str
    pod: str
    pod_uid: str
    container: str
    mode: ComputeMode
    gpus: tuple[str, ...]


@dataclass(frozen=True)
class NodeFacts:
    gpus: tuple[GpuInfo, ...] = ()  # NVML's; empty when NVML is down
    cdi_devices: frozenset[str] = frozenset()  # fully qualified names (`kind=name`) of the node's CDI specs
    device_nodes: Mapping[str, DeviceNode] = field(default_factory=dict)  # host GPU device nodes by path
    not_served: Mapping[ComputeMode, str | None] = field(default_factory=dict)  # per mode: why not (None: served)
    serving: tuple[ServingContainer, ...] = ()


@dataclass(frozen=True)
class Policy:
    """The operator's choices (chart `nri.*`)."""

    void_env_grants: bool = True  # void NVIDIA_VISIBLE_DEVICES-style grants of containers that are no fraction
    trusted_namespaces: frozenset[str] = frozenset()  # whose pods keep their env grants (the GPU stack's own)


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    env: Mapping[str, str]


@dataclass(frozen=True)
class Injection:
    outcome: Outcome
    cdi_devices: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    set_env: Mapping[str, str] = field(default_factory=dict)
    remove_env: tuple[str, ...] = ()
    serving: ServingContainer | None = None  # a fraction: what it holds once created
    note: str = ""  # for the log: what was decided and why


class RefusalReason(StrEnum):
    """The Event reason of a refusal (CamelCase, as `kubectl describe pod` shows it)."""

    NOT_ADMITTED = "GPUFractionNotAdmitted"
    UNREADABLE = "GPUFractionUnreadable"
    NOT_BOUND = "GPUFractionNotBound"
    MODE_NOT_ENFORCED = "GPUModeNotEnforced"
    UNKNOWN_DEVICE = "GPUDeviceUnknown"
    MODE_CONFLICT = "GPUServesOtherMode"
    LIMIT_ENV_MISMATCH = "GPULimitEnvMismatch"


@dataclass(frozen=True)
class Refusal:
    reason: RefusalReason
    message: str
    outcome: Outcome = Outcome.REFUSED


def decide(pod: PodInfo, container: ContainerInfo, node: NodeFacts, policy: Policy = Policy()) -> Injection | Refusal:
    canonical = read_canonical(pod.annotations)
    where = f"container {container.name} of pod {pod}"
    for item in canonical.unreadable:
        if item.container in (container.name, None):
            return Refusal(RefusalReason.UNREADABLE,
                           f"{where}: gpufrac's annotation {item.key}={item.value!r} does not parse ({item.reason}); "
                           "the webhook writes these annotations: recreate the pod so it writes them again")
    fraction = canonical.fractions.get(container.name)
    if fraction is None:
        bypass = _bypassed_keys(pod.annotations, container.name, bool(canonical.fractions))
        if bypass:
            return Refusal(RefusalReason.NOT_ADMITTED,
                           f"{where} asks for a GPU fraction ({', '.join(bypass)}) but carries none of the "
                           f"{CANONICAL_PREFIX}{container.name}.* annotations the gpufrac webhook writes: the "
                           "webhook did not admit it (bypassed, or down with failurePolicy Ignore); recreate the pod "
                           "while the webhook is up")
        if not policy.void_env_grants or pod.namespace in policy.trusted_namespaces:
            return Injection(Outcome.UNTOUCHED)
        return _no_gpu(container)
    return _fraction(pod, container, fraction, node, where)


def _bypassed_keys(annotations: Mapping[str, str], container: str, admitted: bool) -> list[str]:
    """The fraction keys that ask for a GPU for this container without the webhook's canonical ones: keys naming
    the container, or (in a pod the webhook never admitted) the pod-level shorthands."""
    keys = []
    for key in sorted(annotations):
        if not is_fraction_key(key):
            continue
        if key in SHORTHAND_KEYS:
            if not admitted:
                keys.append(key)
            continue
        try:
            parsed = parse_container_key(key)
        except MalformedKeyError:
            parsed = None
        if parsed is None or parsed.container == container or not admitted:
            keys.append(key)
    return keys


def _no_gpu(container: ContainerInfo) -> Injection:
    visible = container.env.get(LimitEnv.VISIBLE_DEVICES)
    asks = visible is not None and visible.strip() not in NO_GPU_VALUES
    removed = tuple(name for name in GRANT_ENV_REMOVED if name in container.env)
    if not asks and not removed:
        return Injection(Outcome.UNTOUCHED)
    granted = [f"{LimitEnv.VISIBLE_DEVICES}={visible}"] if asks else []
    return Injection(
        Outcome.VOIDED,
        set_env={LimitEnv.VISIBLE_DEVICES: NO_GPU} if asks else {},
        remove_env=removed,
        note=f"not a GPU fraction: voided {', '.join(granted + list(removed))}",
    )


def _fraction(pod: PodInfo, container: ContainerInfo, fraction: CanonicalFraction, node: NodeFacts,
              where: str) -> Injection | Refusal:
    devices_key = nvidia_key(container.name, Field.DEVICES)
    if not fraction.devices:
        return Refusal(RefusalReason.NOT_BOUND,
                       f"{where} is a GPU fraction with no GPU bound ({devices_key} is missing): the scheduler writes "
                       "it when it binds the pod; a pod bound without it gets no GPU")
    if fraction.limit_mib is None:
        return Refusal(RefusalReason.NOT_BOUND,
                       f"{where} is a GPU fraction without a memory limit in MiB "
                       f"({CANONICAL_PREFIX}{container.name}.gpu-memory.limit-mib): the webhook writes it when the "
                       "scheduler binds the pod; it never gets a GPU without limits")
    reason = node.not_served.get(fraction.mode, f"the agent does not serve {fraction.mode}")
    if reason is not None:
        return Refusal(RefusalReason.MODE_NOT_ENFORCED,
                       f"{where} is a {fraction.mode} GPU fraction, which this node does not enforce now: {reason}")
    resolved = [_resolve(entry, node) for entry in fraction.devices]
    unknown = [entry for entry, r in zip(fraction.devices, resolved, strict=True) if r is None]
    if unknown:
        return Refusal(RefusalReason.UNKNOWN_DEVICE,
                       f"{where}: {devices_key}={','.join(fraction.devices)} names {', '.join(unknown)}, which this "
                       f"node does not have (its GPUs: {_describe_gpus(node)}; CDI devices: "
                       f"{', '.join(sorted(node.cdi_devices)) or 'none'})")
    grants = [r for r in resolved if r is not None]
    gpus = tuple(g.gpu for g in grants)
    conflict = _mode_conflict(pod, fraction.mode, gpus, node.serving)
    if conflict is not None:
        return Refusal(RefusalReason.MODE_CONFLICT, f"{where} is a {fraction.mode} GPU fraction but {conflict}")
    running = RunningContainer(pod.namespace, pod.name, pod.uid, container.name, container.id, fraction)
    missing, wrong = env_mismatches(running, container.env)
    if missing or wrong:
        problems = [f"{name} missing" for name in missing] + wrong
        return Refusal(RefusalReason.LIMIT_ENV_MISMATCH,
                       f"{where}: its limit env does not match gpufrac's annotations ({'; '.join(problems)}); the "
                       "webhook sets that env from the annotations: recreate the pod so it does")
    cdi = tuple(g.cdi for g in grants if g.cdi is not None)
    nodes = [g.node for g in grants if g.node is not None]
    if nodes:
        nodes += [node.device_nodes[path] for path in CONTROL_DEVICES if path in node.device_nodes]
    serving = ServingContainer(container.id, pod.namespace, pod.name, pod.uid, container.name, fraction.mode, gpus)
    given = ", ".join([*cdi, *(n.path for n in nodes)])
    return Injection(Outcome.INJECTED, cdi_devices=cdi, device_nodes=tuple(nodes), serving=serving,
                     note=f"{fraction.mode} GPU fraction: gets {given}")


@dataclass(frozen=True)
class _Grant:
    """How one gpus.devices entry is handed out: a CDI name or a device node, and the GPU (UUID) it is."""

    cdi: str | None
    node: DeviceNode | None
    gpu: str


def _resolve(entry: str, node: NodeFacts) -> _Grant | None:
    identity = gpu_identity(entry, node.gpus)
    if "=" in entry:  # a CDI name, used as written
        return _Grant(entry, None, identity) if entry in node.cdi_devices else None
    gpu = _gpu(entry, node.gpus)
    for kind in CDI_KINDS:
        for name in (entry,) if gpu is None else (gpu.uuid, str(gpu.index)):
            if f"{kind}={name}" in node.cdi_devices:
                return _Grant(f"{kind}={name}", None, identity)
    device = node.device_nodes.get(f"{GPU_DEVICE_PREFIX}{gpu.index}") if gpu is not None else None
    return _Grant(None, device, identity) if device is not None else None


def gpu_identity(entry: str, gpus: Iterable[GpuInfo]) -> str:
    """The GPU a gpus.devices entry names, as one string whatever its spelling: the UUID where NVML knows it
    (`1`, `GPU-a`, `nvidia.com/gpu=1` are the same GPU), else the entry's id."""
    identifier = device_id(entry)
    gpu = _gpu(identifier, gpus)
    return gpu.uuid if gpu is not None else identifier


def serving_container(pod: PodInfo, container: ContainerInfo, gpus: Iterable[GpuInfo]) -> ServingContainer | None:
    """What a fractional container that already exists holds (from the runtime's Synchronize); None: no fraction."""
    fraction = read_canonical(pod.annotations).fractions.get(container.name)
    if fraction is None or not fraction.devices:
        return None
    known = tuple(gpus)
    return ServingContainer(container.id, pod.namespace, pod.name, pod.uid, container.name, fraction.mode,
                            tuple(gpu_identity(entry, known) for entry in fraction.devices))


def _gpu(identifier: str, gpus: Iterable[GpuInfo]) -> GpuInfo | None:
    return next((g for g in gpus if identifier in (g.uuid, str(g.index))), None)


def _describe_gpus(node: NodeFacts) -> str:
    return ", ".join(f"{g.index} ({g.uuid})" for g in node.gpus) or "none known (NVML)"


def _mode_conflict(pod: PodInfo, mode: ComputeMode, gpus: tuple[str, ...],
                   serving: Iterable[ServingContainer]) -> str | None:
    """Which running container of another pod holds one of these GPUs in the other mode (None: none does)."""
    for other in serving:
        if other.mode is mode or other.pod_uid == pod.uid:
            continue
        shared = [g for g in gpus if g in other.gpus]
        if shared:
            return (f"GPU {shared[0]} serves {other.mode} to container {other.container} of pod "
                    f"{other.namespace}/{other.pod}: the two modes do not share a GPU; the container is created "
                    "once that pod is gone (or the scheduler places this one elsewhere)")
    return None
