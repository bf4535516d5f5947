"""What the validating webhook denies, on the final object after every mutating webhook has run.

Pure. The value rules come from `fractions.resolve`; this module adds who may change what, that the
webhook's own output is intact, and the container-level rules that keep a fraction inside its boundary.
"""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import ComputeMode, Field
from gpufrac.core.contract import (
    FRACTIONAL_LABEL,
    FRACTIONAL_VALUE,
    LIMIT_ENV_PREFIXES,
    NO_GPU_VALUES,
    Delivery,
    LimitEnv,
)
from gpufrac.webhook.decide import pod as podview
from gpufrac.webhook.decide.errors import Violation, annotation, show_value
from gpufrac.webhook.decide.fractions import ContainerFraction, PodFractions, portion_container, resolve
from gpufrac.webhook.decide.mutation import (
    SHM_VOLUME,
    canonical_annotations,
    injected_env,
    injected_mounts,
    injected_volumes,
    volume_name,
)
from gpufrac.webhook.decide.policy import Policy, UserInfo

# Capabilities that let a container reach devices or namespaces beyond its own (ALL includes SYS_ADMIN).
ESCALATING_CAPABILITIES = frozenset({"SYS_ADMIN", "ALL"})
IMMUTABLE = "fraction annotations cannot change after the pod is created; delete and recreate the pod"


def user_fraction_keys(annotations: dict[str, str]) -> dict[str, str]:
    """The fraction annotations users and the scheduler write (everything but the webhook's own)."""
    return {k: v for k, v in annotations.items() if ann.is_fraction_key(k) and not k.startswith(ann.GPUFRAC_DOMAIN)}


def _scheduler_names(policy: Policy) -> str:
    names = sorted(policy.scheduler_users) + [f"group {g}" for g in sorted(policy.scheduler_groups)]
    return ", ".join(names) or "no identity (none configured)"


def _is_bind_key(key: str, portion: str | None) -> bool:
    """Keys the scheduler adds at bind: devices, and absolute memory for the container that asked for a portion
    (`portion`: that container of the pod before the UPDATE)."""
    try:
        parsed = ann.parse_container_key(key)
    except ann.MalformedKeyError:
        return False  # `resolve` reports it
    if parsed is None or parsed.prefix != ann.NVIDIA_PREFIX:
        return False
    if parsed.suffix in ann.BIND_ONLY_FIELDS:
        return True
    if parsed.suffix in (Field.MEMORY_REQUEST, Field.MEMORY_LIMIT):
        return portion is not None and parsed.container == portion
    return False


def authorship(old: dict[str, Any] | None, new: dict[str, Any], user: UserInfo, policy: Policy) -> list[Violation]:
    new_keys = user_fraction_keys(podview.annotations(new))
    if old is None:
        return authorship_on_create(new_keys, user, policy)
    return authorship_on_update(old, new, new_keys, user, policy)


def authorship_on_create(new_keys: dict[str, str], user: UserInfo, policy: Policy) -> list[Violation]:
    """Only the scheduler writes its bind-time keys, and it never creates pods."""
    if policy.is_scheduler(user):
        return []
    return [annotation(key, value, f"is written by the scheduler at bind ({_scheduler_names(policy)}), not on create")
            for key, value in new_keys.items() if _bind_only(key)]


def authorship_on_update(old: dict[str, Any], new: dict[str, Any], new_keys: dict[str, str], user: UserInfo,
                          policy: Policy) -> list[Violation]:
    """No fraction annotation and not the label changes after CREATE, but what the scheduler adds at bind."""
    out: list[Violation] = []
    old_keys = user_fraction_keys(podview.annotations(old))
    # The scheduler adding keys (its bind) needs only which container of the old pod holds a portion.
    binding = policy.is_scheduler(user) and bool(new_keys.keys() - old_keys.keys())
    portion = portion_container(old) if binding else None
    old_fractions = functools.cache(lambda: resolve(old, bound=True)[0])  # once, and only for a key it may not add
    for key in sorted(old_keys.keys() | new_keys.keys()):
        if key not in new_keys:
            out.append(annotation(key, old_keys[key], f"was removed; {IMMUTABLE}"))
        elif key not in old_keys:
            if not (binding and _is_bind_key(key, portion)):
                why = _not_a_bind_key(key, old_fractions) if binding else _not_the_scheduler(key)
                out.append(annotation(key, new_keys[key], f"cannot be added by {user.username or 'this user'}: {why}"))
        elif old_keys[key] != new_keys[key]:
            out.append(annotation(key, new_keys[key], f"was changed from {old_keys[key]}; {IMMUTABLE}"))
    old_label = podview.labels(old).get(FRACTIONAL_LABEL)
    if old_label is not None and podview.labels(new).get(FRACTIONAL_LABEL) != old_label:
        out.append(Violation(f"label {FRACTIONAL_LABEL}", "is set by gpufrac and cannot be changed or removed"))
    return out


def _not_the_scheduler(key: str) -> str:
    return "only the scheduler may add it, at bind" if _bind_shape(key) else IMMUTABLE


def _not_a_bind_key(key: str, old_fractions: Callable[[], PodFractions]) -> str:
    """Why the scheduler may not add this key (it is the scheduler: "only the scheduler may" would not help)."""
    try:
        parsed = ann.parse_container_key(key)
    except ann.MalformedKeyError:
        parsed = None  # `resolve` reports the key itself
    if parsed is None or not _bind_shape(key):
        return IMMUTABLE
    name = parsed.container
    if name not in old_fractions().containers:
        return (f"container {name} holds no GPU fraction, so there is nothing to bind for it; "
                f"{', '.join(sorted(old_fractions().names())) or 'no container'} of this pod holds one")
    return (f"container {name} asked for absolute memory, which is written on create; the scheduler adds "
            f"gpu-memory.request and .limit at bind only for a portion ({ann.FRACTION})")


def _bind_shape(key: str) -> bool:
    return key.startswith(ann.NVIDIA_PREFIX) and key.endswith(
        (*(f".{f}" for f in ann.BIND_ONLY_FIELDS), f".{Field.MEMORY_REQUEST}", f".{Field.MEMORY_LIMIT}"))


def _bind_only(key: str) -> bool:
    """Keys only the scheduler ever writes (devices, compute portion), whoever creates the pod."""
    return key.startswith(ann.NVIDIA_PREFIX) and key.endswith(tuple(f".{f}" for f in ann.BIND_ONLY_FIELDS))


def webhook_output(obj: dict[str, Any], fractions: PodFractions) -> list[Violation]:
    """The `gpufrac.io/` annotations and label must be exactly what the webhook derives from the fraction keys."""
    out: list[Violation] = []
    expected = canonical_annotations(fractions)
    actual = {k: v for k, v in podview.annotations(obj).items() if k.startswith(ann.GPUFRAC_DOMAIN)}
    for key in sorted(expected.keys() | actual.keys()):
        if actual.get(key) == expected.get(key):
            continue
        if key not in expected:
            out.append(annotation(key, actual[key], "is not one gpufrac writes for this pod; remove it"))
        else:
            problem = f"must be {expected[key]}, as gpufrac computes it from the fraction annotations"
            if key not in actual:
                problem += ", but it is missing"
            out.append(annotation(key, actual.get(key), problem + " (only the gpufrac webhook writes them)"))
    label = podview.labels(obj).get(FRACTIONAL_LABEL)
    if fractions.is_fractional and label != FRACTIONAL_VALUE:
        out.append(Violation(f"label {FRACTIONAL_LABEL}", f"must be {FRACTIONAL_VALUE} on a pod with GPU fractions "
                             "(the node agent finds them by it); it is set by the gpufrac mutating webhook"))
    elif not fractions.is_fractional and label is not None:
        out.append(Violation(f"label {FRACTIONAL_LABEL}", "is only for pods with GPU fractions; remove it"))
    return out


@functools.lru_cache(maxsize=256)
def _expected_env(container: str, mode: ComputeMode, policy: Policy) -> tuple[dict[str, Any], ...]:
    """What the mutation injects, to compare with (never written into a pod: shared between reviews)."""
    return tuple(injected_env(container, mode, policy))


@functools.lru_cache(maxsize=16)
def _expected_mounts(mode: ComputeMode, policy: Policy) -> tuple[tuple[dict[str, Any], dict[str, Any]], ...]:
    """(mount, the pod volume it mounts) the mutation injects for a container of this mode, to compare with."""
    volumes = {v["name"]: v for v in injected_volumes(mode, policy)}
    return tuple((mount, volumes[mount["name"]]) for mount in injected_mounts(mode, policy))


def injection(obj: dict[str, Any], fractions: PodFractions, policy: Policy) -> list[Violation]:
    """Each fractional container carries exactly the env and mount the mutating webhook injects."""
    out: list[Violation] = []
    volumes = {v["name"]: v for v in podview.volumes(obj)}
    for ref in podview.containers(obj, podview.ContainerKind.CONTAINER, podview.ContainerKind.INIT):
        fraction = fractions.containers.get(ref.name)
        if fraction is None:
            continue
        env = {e["name"]: e for e in podview.env(ref)}
        mounts = podview.volume_mounts(ref)
        missing = [w["name"] for w in _expected_env(ref.name, fraction.mode, policy) if env.get(w["name"]) != w]
        for mount, volume in _expected_mounts(fraction.mode, policy):
            if mount not in mounts or volumes.get(mount["name"]) != volume:
                missing.append(f"the {mount['name']} volume mount at {mount['mountPath']}")
        if missing:
            out.append(Violation(f"container {ref.name}", f"lacks what gpufrac injects ({', '.join(missing)}): the "
                                 "gpufrac mutating webhook did not run or its changes were undone"))
    return out


# What KAI's admission writes in its older GPU-sharing mode (its `gpusharing` plugin: KAI <= 0.17, and later releases
# in any mode but NvFractions): a ConfigMap name prefix on the pod, and env from those ConfigMaps, which its binder
# fills at bind instead of writing the per-container memory and gpus.devices annotations gpufrac enforces.
KAI_SHARED_GPU_CONFIGMAP = "runai/shared-gpu-configmap"
KAI_CONFIGMAP_ENV = (str(LimitEnv.VISIBLE_DEVICES), "GPU_PORTION", "RUNAI_NUM_OF_GPUS")
KAI_SHARING_FIX = ("run KAI >= 0.18 in its NvFractions mode (Helm global.gpuSharingMode=NvFractions, which "
                   "global.nvFractions.set=true also selects), or turn KAI's GPU sharing off (global.gpuSharing=false; "
                   "global.gpuSharingMode=Disabled from 0.18); docs/kai.md lists the KAI versions and settings")


def kai_older_sharing_mode(obj: dict[str, Any]) -> list[Violation]:
    """A pod KAI's older GPU-sharing admission mutated: its GPU would come from ConfigMaps gpufrac does not know,
    with no memory limit, so it is denied with the KAI setting to change (instead of "did not run")."""
    prefix = podview.annotations(obj).get(KAI_SHARED_GPU_CONFIGMAP)
    if prefix is not None:
        return [annotation(KAI_SHARED_GPU_CONFIGMAP, prefix, "was written by KAI's admission in its older GPU-sharing "
                           "mode, whose binder hands the GPU out through ConfigMaps (GPU_PORTION, "
                           "NVIDIA_VISIBLE_DEVICES) and never writes the memory or gpus.devices annotations gpufrac "
                           f"enforces, so this pod would start without its GPU or its limits: {KAI_SHARING_FIX}")]
    for ref in podview.containers(obj, podview.ContainerKind.CONTAINER, podview.ContainerKind.INIT):
        for entry in podview.env(ref):
            source = (entry.get("valueFrom") or {}).get("configMapKeyRef")
            if entry.get("name") in KAI_CONFIGMAP_ENV and isinstance(source, dict):
                return [Violation(f"container {ref.name}", f"takes env {entry['name']} from ConfigMap "
                                  f"{show_value(str(source.get('name')))}, as KAI's admission in its older "
                                  f"GPU-sharing mode writes it, which gpufrac cannot enforce: {KAI_SHARING_FIX}")]
    return []


def _host_path(path: str) -> str:
    """A hostPath as the node resolves it: normalized, with /var/run read as the /run it links to."""
    path = posixpath.normpath("/" + path.lstrip("/"))
    if path == "/var/run" or path.startswith("/var/run/"):
        path = "/run" + path[len("/var/run"):]
    return path


def _is_mps_path(path: str, policy: Policy) -> bool:
    path = _host_path(path)
    for directory in (*policy.mps_dirs.values(), policy.mps_shm_dir):
        directory = _host_path(directory)
        if path == directory or path.startswith(directory + "/") or directory.startswith(path.rstrip("/") + "/"):
            return True
    return False


def foreign_mps_volume(volume: dict[str, Any], policy: Policy) -> list[Violation]:
    """A volume gpufrac did not write that reaches the node's MPS directories: a hostPath into them, or a volume
    of gpufrac's CSI driver."""
    host_path = volume.get("hostPath")
    if isinstance(host_path, dict) and isinstance(host_path.get("path"), str) and \
            _is_mps_path(host_path["path"], policy):
        return [Violation(f"volume {volume['name']}", f"mounts {host_path['path']}, the node's MPS directories; "
                          "gpufrac mounts the right one into each fractional container")]
    csi = volume.get("csi")
    if isinstance(csi, dict) and csi.get("driver") == policy.csi_driver:
        return [Violation(f"volume {volume['name']}", f"uses gpufrac's CSI driver {policy.csi_driver}; gpufrac "
                          "writes the one volume each fractional container's mode needs (gpufrac-mps-<mode>)")]
    return []


@functools.lru_cache(maxsize=16)
def _our_volumes(policy: Policy) -> tuple[dict[str, ComputeMode | None], dict[str, dict[str, Any]]]:
    """The volume names gpufrac writes, each with the mode whose directories it holds (None: the shared memory
    of every mode), and the volumes it writes by name; to compare with, never written into a pod."""
    ours: dict[str, ComputeMode | None] = {volume_name(mode): mode for mode in policy.mps_dirs}
    if policy.delivery is Delivery.HOST_PATH:
        ours[SHM_VOLUME] = None
    written = {v["name"]: v for mode in policy.mps_dirs for v in injected_volumes(mode, policy)}
    return ours, written


def boundaries(obj: dict[str, Any], fractions: PodFractions, policy: Policy) -> list[Violation]:
    """What would let a fractional pod, or a container beside a fraction, reach past the fraction: each named rule
    below, the pod's first, then each container's, container by container."""
    out = [*boundary_host_namespaces(obj), *boundary_foreign_volumes(obj, policy)]
    for ref in podview.containers(obj):
        container = _PodContainer.of(ref, fractions, policy)
        for rule in _CONTAINER_BOUNDARIES:
            out += rule(container)
    return out


def boundary_host_namespaces(obj: dict[str, Any]) -> list[Violation]:
    pod_spec = podview.spec(obj)
    return [Violation("pod", f"sets {field}: true; a pod with GPU fractions cannot share the host's process or IPC "
                             "namespace, which would reach other pods' GPU work")
            for field in ("hostPID", "hostIPC") if pod_spec.get(field) is True]


def boundary_foreign_volumes(obj: dict[str, Any], policy: Policy) -> list[Violation]:
    _, written = _our_volumes(policy)
    return [violation for volume in podview.volumes(obj) if written.get(volume["name"]) != volume
            for violation in foreign_mps_volume(volume, policy)]


@dataclass(frozen=True)
class _PodContainer:
    """A container of a fractional pod, as the container rules of `boundaries` see it."""

    ref: podview.ContainerRef
    where: str  # how a denial names it
    fraction: ContainerFraction | None  # its own fraction (an ephemeral container never holds one)
    fractions: PodFractions
    our_volumes: dict[str, ComputeMode | None]  # gpufrac's volume names, each with the mode it holds

    @classmethod
    def of(cls, ref: podview.ContainerRef, fractions: PodFractions, policy: Policy) -> _PodContainer:
        ephemeral = ref.kind is podview.ContainerKind.EPHEMERAL
        return cls(ref, f"{'ephemeral ' if ephemeral else ''}container {ref.name}",
                   None if ephemeral else fractions.containers.get(ref.name), fractions, _our_volumes(policy)[0])


def boundary_whole_gpus(c: _PodContainer) -> list[Violation]:
    if ann.WHOLE_GPU_RESOURCE not in podview.resource_names(c.ref):
        return []
    return [Violation(c.where, f"asks for whole GPUs ({ann.WHOLE_GPU_RESOURCE}) in a pod with GPU fractions; put "
                               "whole-GPU and fractional work in separate pods")]


def boundary_mps_mounts(c: _PodContainer) -> list[Violation]:
    """Each MPS directory only into a fraction of its mode; the shared memory only into a fraction."""
    out: list[Violation] = []
    for mount in podview.volume_mounts(c.ref):
        if mount["name"] not in c.our_volumes:
            continue
        mode = c.our_volumes[mount["name"]]
        if mode is None and c.fraction is None:
            out.append(Violation(c.where, "mounts the MPS daemons' shared memory but is not a GPU fraction"))
        elif mode is not None and (c.fraction is None or c.fraction.mode != mode):
            out.append(Violation(c.where, f"mounts the {mode} MPS directory but is not a {mode} fraction"))
    return out


def boundary_privileged(c: _PodContainer) -> list[Violation]:
    """Any container of a fractional pod, not only the fractional one: a privileged sidecar would hand the pod every
    GPU of the node."""
    if podview.security_context(c.ref).get("privileged") is not True:
        return []
    return [Violation(c.where, "is privileged: a privileged container sees every GPU on the node, so it cannot be "
                               "part of a pod with GPU fractions; remove securityContext.privileged")]


def boundary_capabilities(c: _PodContainer) -> list[Violation]:
    escalating = sorted({cap for cap in podview.added_capabilities(c.ref)
                         if cap.upper().removeprefix("CAP_") in ESCALATING_CAPABILITIES})
    if not escalating:
        return []
    return [Violation(c.where, f"adds {', '.join(escalating)}, which grants SYS_ADMIN and lets it leave the GPU "
                               "fraction of its pod; remove it")]


def boundary_limit_env(c: _PodContainer) -> list[Violation]:
    return limit_env_outside_fractions(c.where, c.ref, c.fractions) if c.fraction is None else []


# In this order for each container, as a denial lists them.
_CONTAINER_BOUNDARIES: tuple[Callable[[_PodContainer], list[Violation]], ...] = (
    boundary_whole_gpus, boundary_mps_mounts, boundary_privileged, boundary_capabilities, boundary_limit_env)


def limit_env_outside_fractions(where: str, ref: podview.ContainerRef, fractions: PodFractions) -> list[Violation]:
    """A container beside the fractions may not see a GPU nor carry the limits' env."""
    out: list[Violation] = []
    for entry in podview.env(ref):
        name = entry["name"]
        if name == LimitEnv.VISIBLE_DEVICES and entry.get("value") not in NO_GPU_VALUES:
            out.append(Violation(where, f"sets {LimitEnv.VISIBLE_DEVICES} in a pod with GPU fractions; only "
                                        f"{' or '.join(NO_GPU_VALUES)} is allowed outside the fractional "
                                        f"containers ({', '.join(sorted(fractions.names()))})",))
        elif name.startswith(LIMIT_ENV_PREFIXES):
            out.append(Violation(where, f"sets {name}, which only the fractional containers carry, as gpufrac "
                                        "injects it"))
    return out


def validate_pod(obj: dict[str, Any], old: dict[str, Any] | None, user: UserInfo, policy: Policy) -> list[Violation]:
    """Every rule for a pod being created (old is None) or updated."""
    fractions, out = resolve(obj, bound=old is not None, allow_multiple=policy.allow_multiple_fraction_containers)
    who_wrote = authorship(old, obj, user, policy)
    if not out and not who_wrote:
        # Otherwise the canonical values differ only as a consequence of what is already denied: saying so
        # too would bury the cause.
        out += webhook_output(obj, fractions)
    out += who_wrote
    if fractions.is_fractional:
        if old is None:
            # What KAI's older mode changed would otherwise read as gpufrac's injection undone: name the cause.
            out += kai_older_sharing_mode(obj) or injection(obj, fractions, policy)
        out += boundaries(obj, fractions, policy)
    return out


def validate_template(template: dict[str, Any], policy: Policy) -> list[Violation]:
    """The rules a pod made from this template meets on CREATE before anything is injected: its values, the
    scheduler's keys (a controller creates these pods, never the scheduler), and the boundaries of a fraction."""
    fractions, out = resolve(template, bound=False, allow_multiple=policy.allow_multiple_fraction_containers)
    out += authorship(None, template, UserInfo(""), policy)
    if fractions.is_fractional:
        out += boundaries(template, fractions, policy)
    return out


def validate_status(obj: dict[str, Any], old: dict[str, Any]) -> list[Violation]:
    """pods/status may write metadata too: none of the fraction annotations, ours, or the label may change there."""
    def guarded(pod: dict[str, Any]) -> dict[str, str]:
        annotations = podview.annotations(pod)
        return {k: v for k, v in annotations.items() if ann.is_fraction_key(k)}

    before, after = guarded(old), guarded(obj)
    out = [annotation(key, after.get(key, before.get(key)), "cannot be changed through pods/status")
           for key in sorted(before.keys() | after.keys()) if before.get(key) != after.get(key)]
    if podview.labels(old).get(FRACTIONAL_LABEL) != podview.labels(obj).get(FRACTIONAL_LABEL):
        out.append(Violation(f"label {FRACTIONAL_LABEL}", "cannot be changed through pods/status"))
    return out


def validate_binding(binding: dict[str, Any]) -> list[Violation]:
    """Annotations on a Binding are copied onto the pod without admission of the pod: none of ours may ride it."""
    annotations = podview.annotations(binding)
    return [annotation(k, annotations[k], "cannot be set through a Binding (it would skip the gpufrac checks); "
                                          "set it on the pod before binding")
            for k in sorted(annotations) if ann.is_fraction_key(k)]


# The names tests/hardening/test_properties.py imports (from before the rule modules named these checks publicly).
_authorship, _boundaries, _webhook_output = authorship, boundaries, webhook_output
