"""What the mutating webhook writes: canonical annotations, the label, and each fractional container's limits.

Pure: `mutate_*` take the pod and return a changed copy plus warnings; the JSON patch is the diff of the two
(`patch.py`: the copy shares what the mutation does not write, so the diff only looks at what it did).
Everything is keyed by name, so mutating an already-mutated pod changes nothing (reinvocationPolicy IfNeeded).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import CanonicalField, ComputeMode, Field
from gpufrac.core.contract import (
    ENFORCING,
    FRACTIONAL_LABEL,
    FRACTIONAL_VALUE,
    MODE_ATTRIBUTE,
    NO_COMPUTE_CAP,
    NO_GPU,
    PIPE_SUBDIR,
    SHM_MOUNT_PATH,
    SHM_SUBDIR,
    CanonicalFraction,
    Delivery,
    LimitEnv,
    active_thread_percent,
    enforcement_label,
    pinned_limits,
    reclaim_backoff_label,
    write_canonical,
)
from gpufrac.core.owners import controller_of
from gpufrac.webhook.decide import pod as podview
from gpufrac.webhook.decide.errors import BadReviewError, show_value
from gpufrac.webhook.decide.fractions import ContainerFraction, PodFractions
from gpufrac.webhook.decide.patch import working_copy
from gpufrac.webhook.decide.policy import Policy


@dataclass
class Mutation:
    obj: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


def _active_thread_percent(fraction: ContainerFraction) -> int | None:
    """sm-sharing: the compute portion the scheduler wrote at bind as an MPS percentage, 100 until it writes one.
    time-slicing: none (the portion is a hard SM partition, which time-slicing is not; docs/kai.md)."""
    if fraction.mode is not ComputeMode.SM_SHARING:
        return None
    if fraction.compute_portion is None:
        return NO_COMPUTE_CAP
    return active_thread_percent(fraction.compute_portion)


def canonical_fractions(fractions: PodFractions) -> list[CanonicalFraction]:
    """What the node reads of each container. Devices stay the user's or the scheduler's key: none here."""
    return [CanonicalFraction(c.container, c.mode, c.memory.request_mib, c.memory.limit_mib,
                              pinned_limits(c.memory.limit_mib, c.num_devices),
                              active_thread_percent=_active_thread_percent(c))
            if c.memory is not None
            else CanonicalFraction(c.container, c.mode, None, None, active_thread_percent=_active_thread_percent(c))
            for c in fractions.containers.values()]


def canonical_annotations(fractions: PodFractions) -> dict[str, str]:
    """The `gpufrac.io/` annotations a pod with these fractions must carry, and nothing else."""
    return write_canonical(canonical_fractions(fractions))


def volume_name(mode: ComputeMode) -> str:
    return f"gpufrac-mps-{mode}"


def _field_ref(key: str) -> dict[str, Any]:
    return {"fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{key}']"}}


def injected_env(container: str, mode: ComputeMode, policy: Policy) -> list[dict[str, Any]]:
    """The env of one fractional container. Annotation-backed values are read by the kubelet at container start,
    after the bind, so what the scheduler writes at bind reaches the process."""
    return [
        {"name": LimitEnv.VISIBLE_DEVICES, "valueFrom": _field_ref(ann.nvidia_key(container, Field.DEVICES))},
        {"name": LimitEnv.MEMORY_REQUEST,
         "valueFrom": _field_ref(ann.canonical_key(container, CanonicalField.REQUEST_MIB))},
        {"name": LimitEnv.MEMORY_LIMIT,
         "valueFrom": _field_ref(ann.canonical_key(container, CanonicalField.LIMIT_MIB))},
        {"name": LimitEnv.PINNED_MEM_LIMIT,
         "valueFrom": _field_ref(ann.canonical_key(container, CanonicalField.MPS_PINNED_MEM_LIMIT))},
        *([{"name": LimitEnv.ACTIVE_THREAD_PERCENTAGE,
            "valueFrom": _field_ref(ann.canonical_key(container, CanonicalField.ACTIVE_THREAD_PERCENT))}]
          if mode is ComputeMode.SM_SHARING else []),
        {"name": LimitEnv.PIPE_DIRECTORY, "value": policy.mps_dirs[mode]},
    ]


SHM_VOLUME = "gpufrac-mps-shm"  # hostPath delivery: the daemons' shared memory, one for every mode


def injected_volumes(mode: ComputeMode, policy: Policy) -> list[dict[str, Any]]:
    """The pod volumes a container of this mode mounts."""
    if policy.delivery is Delivery.CSI:
        # An inline ephemeral volume: the agent's CSI plugin refuses it unless this is a fractional pod of this
        # mode on a node enforcing it, so the pod does not start without its limits.
        return [{"name": volume_name(mode),
                 "csi": {"driver": policy.csi_driver, "volumeAttributes": {MODE_ATTRIBUTE: str(mode)}}}]
    # type Directory: if the node agent has not made the directory, the pod does not start, rather than starting
    # without MPS and so without its limits.
    return [{"name": volume_name(mode), "hostPath": {"path": policy.mps_dirs[mode], "type": "Directory"}},
            {"name": SHM_VOLUME, "hostPath": {"path": policy.mps_shm_dir, "type": "Directory"}}]


def injected_mounts(mode: ComputeMode, policy: Policy) -> list[dict[str, Any]]:
    """The pipe directory where CUDA_MPS_PIPE_DIRECTORY says, and the daemons' shared memory at /dev/shm (a
    container's own /dev/shm is private to its pod, and MPS clients share memory with their server)."""
    if policy.delivery is Delivery.CSI:
        return [{"name": volume_name(mode), "mountPath": policy.mps_dirs[mode], "subPath": PIPE_SUBDIR},
                {"name": volume_name(mode), "mountPath": SHM_MOUNT_PATH,
                 "subPath": SHM_SUBDIR}]
    return [{"name": volume_name(mode), "mountPath": policy.mps_dirs[mode]},
            {"name": SHM_VOLUME, "mountPath": SHM_MOUNT_PATH}]


def _set_annotations(obj: dict[str, Any], wanted: dict[str, str], stale_prefix: str, warnings: list[str],
                     user_written: bool) -> None:
    """Make the annotations under `stale_prefix` exactly `wanted`, plus set the other `wanted` keys."""
    annotations = _string_map(obj, "annotations")
    for key in [k for k in annotations if k.startswith(stale_prefix) and k not in wanted]:
        if user_written:
            warnings.append(f"annotation {key}: removed {show_value(annotations[key])}; gpufrac writes these")
        del annotations[key]
    for key, value in wanted.items():
        current = annotations.get(key)
        if current is not None and current != value and user_written:
            warnings.append(f"annotation {key}: replaced {show_value(current)} with {value}, computed by gpufrac")
        annotations[key] = value


def _string_map(obj: dict[str, Any], key: str) -> dict[str, str]:
    """metadata.annotations or .labels of the copy being mutated, created when absent."""
    values = podview.string_map(obj, key)
    obj.setdefault("metadata", {})[key] = values
    return values


def _upsert(items: list[dict[str, Any]], wanted: dict[str, Any], key: str = "name") -> bool:
    """Make `wanted` the one item with its `key` (env and volumes by name, mounts by mountPath: two mounts cannot
    share a path), in place of the first such item (or appended); whether an item that differed was replaced or
    dropped. Later duplicates go too: for env, the last of a name is what counts."""
    positions = [i for i, item in enumerate(items) if item.get(key) == wanted[key]]
    if not positions:
        items.append(wanted)
        return False
    changed = items[positions[0]] != wanted or len(positions) > 1
    items[positions[0]] = wanted
    for index in reversed(positions[1:]):
        del items[index]
    return changed


def _require_enforcing_node(obj: dict[str, Any], mode: ComputeMode) -> None:
    _require_node(obj, {"key": enforcement_label(mode), "operator": "In", "values": [str(v) for v in ENFORCING]})


def _keep_off_reclaimed_nodes(obj: dict[str, Any]) -> None:
    """A pod of a controller whose pod reclaim evicted is kept off that node during the back-off: the agent labels
    the node (contract.reclaim_backoff_label), and this affinity fails where the label is."""
    owner = controller_of(obj.get("metadata") or {})
    if owner is not None:
        _require_node(obj, {"key": reclaim_backoff_label(owner.uid), "operator": "DoesNotExist"})


def _require_node(obj: dict[str, Any], expression: dict[str, Any]) -> None:
    """`expression` added to every required node selector term (one made where there is none)."""
    affinity = podview.child_object(podview.child_object(obj, "spec", "object"), "affinity", "object.spec")
    node_affinity = podview.child_object(affinity, "nodeAffinity", "spec.affinity")
    required = podview.child_object(node_affinity, "requiredDuringSchedulingIgnoredDuringExecution",
                                    "spec.affinity.nodeAffinity")
    terms = podview.child_list(required, "nodeSelectorTerms", "nodeAffinity.required")
    if not terms:
        terms.append({})
    # Terms are ORed: every term must carry the expression for it to hold.
    for term in terms:
        if not isinstance(term, dict):
            raise BadReviewError("nodeSelectorTerms entries must be objects")
        expressions = podview.child_list(term, "matchExpressions", "nodeSelectorTerms[]")
        if expression not in expressions:
            expressions.append(expression)


def _hide_gpus(ref: podview.ContainerRef) -> None:
    """Images such as CUDA's set NVIDIA_VISIBLE_DEVICES=all; a container beside a fraction must not see the GPUs."""
    env = ref.spec["env"] = podview.env(ref)
    if not any(e.get("name") == LimitEnv.VISIBLE_DEVICES for e in env):
        env.append({"name": LimitEnv.VISIBLE_DEVICES, "value": NO_GPU})


def _inject_container(ref: podview.ContainerRef, mode: ComputeMode, policy: Policy, warnings: list[str]) -> None:
    """A fractional container's env and mounts, replacing what it had under those names and paths."""
    env = ref.spec["env"] = podview.env(ref)
    for wanted in injected_env(ref.name, mode, policy):
        if _upsert(env, wanted):
            warnings.append(f"container {ref.name}: env {wanted['name']} was replaced by gpufrac "
                            "(it carries the fraction's limits)")
    mounts = ref.spec["volumeMounts"] = podview.volume_mounts(ref)
    for mount in injected_mounts(mode, policy):
        if _upsert(mounts, mount, key="mountPath"):
            warnings.append(f"container {ref.name}: the volume mount at {mount['mountPath']} was replaced by gpufrac "
                            "(it carries the MPS directories)")


def mutate_create(obj: dict[str, Any], fractions: PodFractions, policy: Policy) -> Mutation:
    """The whole mutation of a pod being created."""
    result = Mutation(working_copy(obj))
    pod = result.obj
    if not fractions.is_fractional:
        return result
    _mark_fractional(pod, fractions, result.warnings)
    modes = {c.mode for c in fractions.containers.values()}
    for ref in podview.containers(pod, podview.ContainerKind.CONTAINER, podview.ContainerKind.INIT):
        fraction = fractions.containers.get(ref.name)
        if fraction is None:
            _hide_gpus(ref)
        else:
            _inject_container(ref, fraction.mode, policy, result.warnings)
    volumes = pod["spec"]["volumes"] = podview.volumes(pod)
    for mode in sorted(modes):
        for volume in injected_volumes(mode, policy):
            if _upsert(volumes, volume):
                result.warnings.append(f"volume {volume['name']} was replaced by gpufrac")
    if policy.require_enforcing_node:
        for mode in sorted(modes):
            _require_enforcing_node(pod, mode)
    if policy.keep_off_reclaimed_nodes:
        _keep_off_reclaimed_nodes(pod)
    return result


def _mark_fractional(pod: dict[str, Any], fractions: PodFractions, warnings: list[str]) -> None:
    """The translated per-container keys (what is written stays), the canonical annotations and the label."""
    annotations = _string_map(pod, "annotations")
    for key, value in fractions.translated.items():
        annotations.setdefault(key, value)
    _set_annotations(pod, canonical_annotations(fractions), ann.CANONICAL_PREFIX, warnings, True)
    labels = _string_map(pod, "labels")
    if labels.get(FRACTIONAL_LABEL, FRACTIONAL_VALUE) != FRACTIONAL_VALUE:
        warnings.append(f"label {FRACTIONAL_LABEL}: replaced {show_value(labels[FRACTIONAL_LABEL])} "
                        f"with {FRACTIONAL_VALUE}")
    labels[FRACTIONAL_LABEL] = FRACTIONAL_VALUE


def mutate_bind(obj: dict[str, Any], fractions: PodFractions) -> Mutation:
    """The scheduler's bind-time UPDATE: derive the canonical annotations from the values it wrote."""
    result = Mutation(working_copy(obj))
    if fractions.is_fractional:
        _set_annotations(result.obj, canonical_annotations(fractions), ann.CANONICAL_PREFIX, result.warnings, False)
    return result


def mutate_ephemeral(obj: dict[str, Any], fractions: PodFractions) -> Mutation:
    """`kubectl debug` on a fractional pod: the debug container gets no GPU unless it says which."""
    result = Mutation(working_copy(obj))
    if not fractions.is_fractional:
        return result
    for ref in podview.containers(result.obj, podview.ContainerKind.EPHEMERAL):
        env = ref.spec["env"] = podview.env(ref)
        if not any(e.get("name") == LimitEnv.VISIBLE_DEVICES for e in env):
            env.append({"name": LimitEnv.VISIBLE_DEVICES, "value": NO_GPU})
    return result
