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
  put into the container are left to it. Except what the kubelet allocated: GPUs the kubelet's device checkpoint
  says it allocated to this pod's container (NVIDIA's device plugin, under any of its strategies; KAI's reservation
  pods) are left to it, and a container naming more than its allocation is refused, or only its env voided where
  CDI devices carry the allocation (whole_gpus.judge). The GPU stack's own containers (gpu_stack: a trusted
  namespace, or a bind of the kubelet's device-plugins directory) keep their env, and the
  policy can leave env grants alone everywhere (`Policy.void_env_grants`).
- Refused: a fraction without the canonical annotations (the webhook was bypassed), one whose canonical values do
  not parse, one with no bound GPU or no memory limit, a mode the node does not enforce now, a device the node does
  not have, a GPU serving the other compute mode to a running container of another pod, and (where the runtime's
  facts are known) devices that would not work: CDI devices containerd < 2.1 drops, or a bare device node for a GPU
  no CDI spec names (runtime_support.delivery_refusal).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from gpufrac.agent.decide.audit import env_mismatches, expected_env
from gpufrac.agent.decide.claim_holders import ClaimHolder, claim_container, clients
from gpufrac.agent.decide.creation_escapes import (
    duplicated,
    foreign_owned_env,
    foreign_visible_gpus,
    legacy_cuda_image,
    mps_user_conflict,
    pipe_dir_problem,
)
from gpufrac.agent.decide.device_nodes import CONTROL_DEVICES, GPU_DEVICE_PREFIX, DeviceNode
from gpufrac.agent.decide.front_door import refusal_for_annotated
from gpufrac.agent.decide.gpu_identity import gpu_identity, gpu_named
from gpufrac.agent.decide.gpu_stack import DEVICE_PLUGINS_DIR, is_gpu_stack
from gpufrac.agent.decide.kubelet_allocations import NO_ALLOCATIONS, KubeletAllocations
from gpufrac.agent.decide.model import GpuInfo, RunningContainer
from gpufrac.agent.decide.pinned_env import uuid_keyed_pinned_env
from gpufrac.agent.decide.request_fit import Owed, does_not_fit
from gpufrac.agent.decide.runtime_support import DeliveryFacts, delivery_refusal
from gpufrac.agent.decide.whole_gpus import Judgement, Verdict, judge, named_gpus
from gpufrac.core.annotations import (
    CANONICAL_PREFIX,
    GPUFRAC_DOMAIN,
    SHORTHAND_KEYS,
    ComputeMode,
    Field,
    MalformedKeyError,
    is_fraction_key,
    nvidia_key,
    parse_container_key,
)
from gpufrac.core.contract import NO_GPU, NO_GPU_VALUES, CanonicalFraction, LimitEnv, read_canonical

# NVIDIA's CDI kinds, most preferred first: the device plugin's (KAI's binder writes it into gpus.devices on CDI
# clusters; its device carries the hook that applies the CUDA 13.4 memory limit), then the toolkit's.
CDI_KINDS = ("k8s.device-plugin.nvidia.com/gpu", "nvidia.com/gpu")
# The device nodes every GPU client needs besides its GPU's own /dev/nvidia<N> (those the host has are given).
# Env names NVIDIA's runtime reads as a grant of GPUs (or of MIG / IMEX capabilities) in a container.
GRANT_ENV_REMOVED = ("NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES", "NVIDIA_IMEX_CHANNELS")


class Outcome(StrEnum):
    """What the plugin did with one container: the `outcome` label of its metric."""

    INJECTED = "injected"  # a fraction: its GPU devices handed out
    VOIDED = "voided"  # not a fraction, and its env asked for a GPU: voided
    UNTOUCHED = "untouched"  # not a fraction, asked for nothing
    REFUSED = "refused"



# The annotation the plugin's adjustment adds to each fraction it serves (its mode and what it was given): how it
# tells, once back after being away, the fractions created without it (nri.decide.sweep).
MARK = "gpufrac.io/nri-served"

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
    uid: int | None = None  # the user it runs as (None: the runtime did not tell)


@dataclass(frozen=True)
class NodeFacts:
    gpus: tuple[GpuInfo, ...] = ()  # NVML's; empty when NVML is down
    cdi_devices: frozenset[str] = frozenset()  # fully qualified names (`kind=name`) of the node's CDI specs
    device_nodes: Mapping[str, DeviceNode] = field(default_factory=dict)  # host GPU device nodes by path
    not_served: Mapping[ComputeMode, str | None] = field(default_factory=dict)  # per mode: why not (None: served)
    serving: tuple[ServingContainer, ...] = ()
    delivery: DeliveryFacts | None = None  # the runtime's facts (runtime_support); None: no delivery refusal
    allocations: KubeletAllocations = NO_ALLOCATIONS  # whole GPUs the kubelet allocated (its device checkpoint)
    dra_gpus: Mapping[str, str] = field(default_factory=dict)  # GPU UUID -> why DRA serves it (decide.front_door)
    multi_user_modes: frozenset[ComputeMode] = frozenset()  # whose MPS daemon serves every UID at once (`-m`)
    usable_mib: Mapping[str, int] = field(default_factory=dict)  # GPU UUID -> usable memory (decide.capacity)
    owed: Mapping[str, tuple[Owed, ...]] = field(default_factory=dict)  # GPU UUID -> requests placed on it
    claim_holders: Mapping[str, ClaimHolder] = field(default_factory=dict)  # time-slicing claim UID -> its pod


@dataclass(frozen=True)
class Policy:
    """The operator's choices (chart `nri.*`)."""

    void_env_grants: bool = True  # void NVIDIA_VISIBLE_DEVICES-style grants of containers that are no fraction
    trusted_namespaces: frozenset[str] = frozenset()  # whose pods keep their env grants (the GPU stack's own)
    # a container that binds one of these host directories in is the GPU stack's own wherever it runs (gpu_stack)
    stack_host_dirs: tuple[str, ...] = (DEVICE_PLUGINS_DIR,)


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str]
    labels: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    env: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)  # the container's own (a device plugin's CDI ones)
    cdi_devices: tuple[str, ...] = ()  # CDI devices the runtime already injects (told from containerd 2.2)
    mounts: tuple[str, ...] = ()  # mount destinations (the device plugin's volume-mounts strategy)
    # the env as the runtime holds it (`K=V`), a name written twice included; `env` is its last-wins reading
    env_entries: tuple[str, ...] = field(default=(), compare=False)
    created_at: float = 0.0  # seconds since the epoch, as the runtime tells it (0: not told)
    pid: int = 0  # its first process, in the host's PID namespace (0: not running, or not told)
    uid: int | None = None  # the user its process runs as (None: the runtime did not tell)
    mount_sources: tuple[str, ...] = field(default=(), compare=False)  # the host paths bound in (hostPath volumes)


@dataclass(frozen=True)
class BindMount:
    """A host directory bound into the container, in place of whatever the container had at `destination`."""

    source: str
    destination: str


@dataclass(frozen=True)
class Injection:
    outcome: Outcome
    cdi_devices: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[BindMount, ...] = ()
    set_env: Mapping[str, str] = field(default_factory=dict)
    remove_env: tuple[str, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)  # added to the container's (MARK)
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
    RUNTIME_DROPS_CDI = "GPURuntimeDropsCdi"  # runtime_support.delivery_refusal
    NO_CDI_SPEC = "GPUWithoutCdiSpec"
    BEYOND_ALLOCATION = "GPUBeyondAllocation"  # names more GPUs than the kubelet allocated it
    ALLOCATION_UNKNOWN = "GPUAllocationUnknown"  # names GPUs while the kubelet's allocations cannot be read
    PIPE_DIR_MISSING = "GPUMpsPipeDirMissing"  # creation_escapes: an sm-sharing fraction outside its MPS daemon
    ENV_DUPLICATED = "GPUEnvDuplicated"  # creation_escapes: an env name the plugin edits, written twice
    LEGACY_IMAGE = "GPULegacyCudaImage"  # creation_escapes: CUDA_VERSION without NVIDIA_VISIBLE_DEVICES
    MPS_USER_CONFLICT = "GPUMpsUserConflict"  # creation_escapes: a single-user MPS daemon serving another UID
    SERVED_THROUGH_DRA = "GPUServedThroughDra"  # front_door: one front door per GPU
    DAEMON_LIMITS_NOT_SET = "GPUMpsLimitsNotSet"  # the sm-sharing daemon could not be told the fraction's limits
    REQUEST_DOES_NOT_FIT = "GPURequestDoesNotFit"  # request_fit: not next to the requests owed on its GPU
    CLAIM_SHARED = "GPUClaimShared"  # decide.claim_holders: a time-slicing claim serves one pod


@dataclass(frozen=True)
class Refusal:
    reason: RefusalReason
    message: str
    outcome: Outcome = Outcome.REFUSED


def decide(pod: PodInfo, container: ContainerInfo, node: NodeFacts, policy: Policy = Policy()) -> Injection | Refusal:
    where, ts = f"container {container.name} of pod {pod}", ComputeMode.TIME_SLICING
    claim = claim_container(pod.uid, container, node.claim_holders,
                            None if ts in node.multi_user_modes else clients(node.serving, ts, container.id))
    if claim is not None and claim.refusal is not None:  # decide.claim_holders: one pod, one user per claim
        return Refusal(RefusalReason.MPS_USER_CONFLICT if claim.user_conflict else RefusalReason.CLAIM_SHARED,
                       f"{where}: {claim.refusal}")
    result = _refuse_duplicated_edits(_decide(pod, container, node, policy), container, where)
    if claim is None or isinstance(result, Refusal) or result.serving is not None:
        return result
    return replace(result, serving=ServingContainer(container.id, pod.namespace, pod.name, pod.uid, container.name,
                                                    ts, claim.gpus, container.uid))


def _refuse_duplicated_edits(result: Injection | Refusal, container: ContainerInfo, where: str) -> Injection | Refusal:
    twice = [] if isinstance(result, Refusal) else \
        duplicated(container.env_entries, [*result.set_env, *result.remove_env])
    if not twice:
        return result
    return Refusal(RefusalReason.ENV_DUPLICATED,
                   f"{where} sets {', '.join(twice)} more than once (the image's ENV and the pod's env, say): the "
                   "runtime keeps every entry and gpufrac's edit would reach only the first; set it once, in the pod "
                   "spec, or not at all")


def _decide(pod: PodInfo, container: ContainerInfo, node: NodeFacts, policy: Policy) -> Injection | Refusal:
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
        stack = is_gpu_stack(pod.namespace, container.mount_sources, policy.trusted_namespaces, policy.stack_host_dirs)
        if not policy.void_env_grants or stack:
            return Injection(Outcome.UNTOUCHED)
        return _not_a_fraction(pod, container, node, where)
    return _fraction(pod, container, fraction, node, where)


def _bypassed_keys(annotations: Mapping[str, str], container: str, admitted: bool) -> list[str]:
    """The fraction keys that ask for a GPU for this container without the webhook's canonical ones: keys naming
    the container, or (in a pod the webhook never admitted) the pod-level shorthands."""
    keys = []
    for key in sorted(annotations):
        if not is_fraction_key(key) or _gpufracs_own_mark(key):
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


def _gpufracs_own_mark(key: str) -> bool:
    """A gpufrac.io/ key outside the per-container grammar asks for no GPU: containerd's tolerate annotation on the
    agent's, the MPS daemons' and the node's other DaemonSets' pods, the plugin's own marks."""
    return key.startswith(GPUFRAC_DOMAIN) and not key.startswith(CANONICAL_PREFIX)


def _not_a_fraction(pod: PodInfo, container: ContainerInfo, node: NodeFacts, where: str) -> Injection | Refusal:
    named = named_gpus(container.env, container.annotations, container.cdi_devices, container.mounts)
    verdict = judge(named, node.allocations, pod.uid, container.name, node.gpus)
    if verdict.verdict is Verdict.NONE_NAMED and legacy_cuda_image(container.env):
        return Refusal(RefusalReason.LEGACY_IMAGE,
                       f"{where} runs a CUDA image (CUDA_VERSION={container.env['CUDA_VERSION']}) that does not set "
                       f"{LimitEnv.VISIBLE_DEVICES}, which NVIDIA's runtime reads as every GPU of the node: set "
                       f"{LimitEnv.VISIBLE_DEVICES}=void in the pod spec, or ask for a GPU")
    if verdict.verdict in (Verdict.NONE_NAMED, Verdict.NOT_ALLOCATED):
        return _no_gpu(container)
    if verdict.verdict is Verdict.ALLOCATED:
        return Injection(Outcome.UNTOUCHED, note=f"whole GPUs the kubelet allocated ({', '.join(verdict.allocated)}):"
                                                 " left to the device plugin")
    if verdict.verdict is Verdict.ENV_BEYOND_CDI:
        return _no_gpu(container, keep_other_grants=True,
                       why=f"its GPUs ({', '.join(verdict.allocated)}) come from its CDI devices")
    return _beyond_allocation(verdict, node.allocations, where)


def _beyond_allocation(verdict: Judgement, allocations: KubeletAllocations, where: str) -> Refusal:
    if verdict.verdict is Verdict.UNKNOWN:
        return Refusal(RefusalReason.ALLOCATION_UNKNOWN,
                       f"{where} names GPUs in {LimitEnv.VISIBLE_DEVICES} but gpufrac cannot tell whether the kubelet "
                       f"allocated them to it: {allocations.problem}; it is created once the agent reads the kubelet's "
                       "device checkpoint again (the kubelet retries)")
    return Refusal(RefusalReason.BEYOND_ALLOCATION,
                   f"{where} names GPUs {', '.join(verdict.beyond)} beyond the whole GPUs the kubelet allocated to it "
                   f"({', '.join(verdict.allocated)}): voiding them would take its GPUs too; remove "
                   f"{LimitEnv.VISIBLE_DEVICES} (or the CDI devices) from the pod spec: the device plugin sets it")


def _no_gpu(container: ContainerInfo, *, keep_other_grants: bool = False, why: str = "not a GPU fraction") -> Injection:
    visible = container.env.get(LimitEnv.VISIBLE_DEVICES)
    asks = visible is not None and visible.strip() not in NO_GPU_VALUES
    removed = () if keep_other_grants else tuple(name for name in GRANT_ENV_REMOVED if name in container.env)
    if not asks and not removed:
        return Injection(Outcome.UNTOUCHED)
    granted = [f"{LimitEnv.VISIBLE_DEVICES}={visible}"] if asks else []
    return Injection(
        Outcome.VOIDED,
        set_env={LimitEnv.VISIBLE_DEVICES: NO_GPU} if asks else {},
        remove_env=removed,
        note=f"{why}: voided {', '.join(granted + list(removed))}",
    )


def _fraction(pod: PodInfo, container: ContainerInfo, fraction: CanonicalFraction, node: NodeFacts,
              where: str) -> Injection | Refusal:
    devices_key = nvidia_key(container.name, Field.DEVICES)
    unbound = _not_bound(container, fraction, where)
    if unbound is not None:
        return unbound
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
    through_dra = next((g for g in gpus if g in node.dra_gpus), None)
    if through_dra is not None:
        return Refusal(RefusalReason.SERVED_THROUGH_DRA,
                       refusal_for_annotated(where, through_dra, node.dra_gpus[through_dra]))
    held = _held_by_others(pod, container, fraction, gpus, node, where)
    if held is not None:
        return held
    running = RunningContainer(pod.namespace, pod.name, pod.uid, container.name, container.id, fraction)
    missing, wrong = env_mismatches(running, container.env)
    if missing or wrong:
        problems = [f"{name} missing" for name in missing] + wrong
        return Refusal(RefusalReason.LIMIT_ENV_MISMATCH,
                       f"{where}: its limit env does not match gpufrac's annotations ({'; '.join(problems)}); the "
                       "webhook sets that env from the annotations: recreate the pod so it does")
    escape = _creation_escape(running, container, gpus, where)
    if escape is not None:
        return escape
    cdi = tuple(g.cdi for g in grants if g.cdi is not None)
    nodes = [g.node for g in grants if g.node is not None]
    bare = delivery_refusal(cdi, [g.gpu for g in grants if g.cdi is None], node.delivery)
    if bare is not None:
        return Refusal(RefusalReason(bare[0]), f"{where}: {bare[1]}")
    if nodes:
        nodes += [node.device_nodes[path] for path in CONTROL_DEVICES if path in node.device_nodes]
    serving = ServingContainer(container.id, pod.namespace, pod.name, pod.uid, container.name, fraction.mode, gpus,
                               container.uid)
    given = ", ".join([*cdi, *(n.path for n in nodes)])
    return Injection(Outcome.INJECTED, cdi_devices=cdi, device_nodes=tuple(nodes), serving=serving,
                     set_env=uuid_keyed_pinned_env(fraction, gpus), annotations={MARK: f"{fraction.mode} {given}"},
                     note=f"{fraction.mode} GPU fraction: gets {given}")


def _held_by_others(pod: PodInfo, container: ContainerInfo, fraction: CanonicalFraction, gpus: tuple[str, ...],
                    node: NodeFacts, where: str) -> Refusal | None:
    """A GPU serving the other mode to another pod, its usable memory requested by others, or the mode's single-user
    MPS daemon serving another UID."""
    mode = fraction.mode
    conflict = _mode_conflict(pod, mode, gpus, node.serving)
    if conflict is not None:
        return Refusal(RefusalReason.MODE_CONFLICT, f"{where} is a {mode} GPU fraction but {conflict}")
    short = does_not_fit(pod.uid, container.name, fraction.request_mib, gpus, node.usable_mib, node.owed)
    if short is not None:
        return Refusal(RefusalReason.REQUEST_DOES_NOT_FIT, f"{where} is a {mode} GPU fraction, but {short}; it is "
                       "created once the others leave room")
    held = None if mode in node.multi_user_modes else mps_user_conflict(container.uid, (
        (s.uid, f"container {s.container} of pod {s.namespace}/{s.pod}") for s in node.serving
        if s.mode is mode and s.container_id != container.id))
    if held is None:
        return None
    return Refusal(RefusalReason.MPS_USER_CONFLICT,
                   f"{where} runs as UID {container.uid}, but this node's {mode} MPS daemon serves one user at a time "
                   f"and serves {held}: MPS would hold its CUDA calls until every client of that UID has exited; run "
                   "it as that UID (securityContext.runAsUser), or on another node")


def _not_bound(container: ContainerInfo, fraction: CanonicalFraction, where: str) -> Refusal | None:
    """A fraction the scheduler and the webhook have not yet made whole: no GPU bound, no limit, or every GPU."""
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
    return None


def _creation_escape(running: RunningContainer, container: ContainerInfo, gpus: tuple[str, ...],
                     where: str) -> Refusal | None:
    """The escapes a fraction's env or mounts would open (creation_escapes), as a refusal."""
    outside = pipe_dir_problem(running.mode, container.env, container.mounts)
    if outside is not None:
        return Refusal(RefusalReason.PIPE_DIR_MISSING,
                       f"{where} is an sm-sharing GPU fraction but {outside}: without its MPS daemon it would run as "
                       "an ordinary CUDA process with the whole GPU; the webhook mounts that directory: recreate the "
                       "pod so it does")
    foreign = foreign_owned_env(container.env, expected_env(running))
    if foreign:
        return Refusal(RefusalReason.LIMIT_ENV_MISMATCH,
                       f"{where} carries {', '.join(foreign)}, which gpufrac owns and did not set for it (from envFrom "
                       "or the image): remove it; gpufrac sets the limits a fraction needs")
    others = foreign_visible_gpus(container.env, gpus)
    if others:
        return Refusal(RefusalReason.LIMIT_ENV_MISMATCH,
                       f"{where} names GPUs it was not given in CUDA_VISIBLE_DEVICES ({', '.join(others)}); its GPUs: "
                       f"{', '.join(gpus)}")
    return None


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
    gpu = gpu_named(entry, node.gpus)
    for kind in CDI_KINDS:
        for name in (entry,) if gpu is None else (gpu.uuid, str(gpu.index)):
            if f"{kind}={name}" in node.cdi_devices:
                return _Grant(f"{kind}={name}", None, identity)
    device = node.device_nodes.get(f"{GPU_DEVICE_PREFIX}{gpu.index}") if gpu is not None else None
    return _Grant(None, device, identity) if device is not None else None


def serving_container(pod: PodInfo, container: ContainerInfo, gpus: Iterable[GpuInfo]) -> ServingContainer | None:
    """What a fractional container that already exists holds (from the runtime's Synchronize); None: no fraction."""
    fraction = read_canonical(pod.annotations).fractions.get(container.name)
    if fraction is None or not fraction.devices:
        return None
    known = tuple(gpus)
    return ServingContainer(container.id, pod.namespace, pod.name, pod.uid, container.name, fraction.mode,
                            tuple(gpu_identity(entry, known) for entry in fraction.devices), container.uid)


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
