"""Whether the CSI node plugin mounts a mode's MPS directories into a pod, and what it mounts. Pure.

One short function per rule; each refusal says what is wrong and what to do, since the kubelet copies it into
the pod's events (`MountVolume.SetUp failed for volume ...: rpc error: code = FailedPrecondition desc = ...`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from gpufrac.core import contract
from gpufrac.core.annotations import CANONICAL_PREFIX, ComputeMode
from gpufrac.core.contract import read_canonical


class RefusalCode(StrEnum):
    """The gRPC status a refusal is sent with (names of grpc.StatusCode)."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"  # the request itself is malformed
    FAILED_PRECONDITION = "FAILED_PRECONDITION"  # the pod or the node is not in a state to get the volume
    UNAVAILABLE = "UNAVAILABLE"  # the API server could not be asked; the kubelet retries


@dataclass(frozen=True)
class Refusal:
    code: RefusalCode
    message: str


@dataclass(frozen=True)
class PublishRequest:
    """What NodePublishVolume asks, from the gRPC request."""

    volume_id: str
    target_path: str
    readonly: bool
    block: bool  # the volume capability asks for a raw block device
    context: Mapping[str, str]


@dataclass(frozen=True)
class PodRef:
    """The pod a volume is for, from the volume context the kubelet adds (CSIDriver podInfoOnMount)."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Bind:
    source: Path
    target: Path
    readonly: bool


@dataclass(frozen=True)
class PublishPlan:
    mode: ComputeMode
    pod: PodRef
    binds: tuple[Bind, ...]


@dataclass(frozen=True)
class NodeDirs:
    """This node's MPS directories, and which modes are served right now (None) or why not (a message)."""

    node: str
    driver: str
    pipe_dirs: Mapping[ComputeMode, Path]
    shm_dir: Path
    not_served: Mapping[ComputeMode, str | None]


def check_request(request: PublishRequest, driver: str) -> Refusal | None:
    """The request's own shape: a volume id, an absolute target, a filesystem volume."""
    if not request.volume_id:
        return Refusal(RefusalCode.INVALID_ARGUMENT, "NodePublishVolume needs a volume_id")
    if not request.target_path or not Path(request.target_path).is_absolute():
        return Refusal(RefusalCode.INVALID_ARGUMENT,
                       f"NodePublishVolume needs an absolute target_path, not {request.target_path!r}")
    if request.block:
        return Refusal(RefusalCode.INVALID_ARGUMENT,
                       f"{driver} volumes are directories: mount them with volumeMounts, not volumeDevices")
    return None


def check_ephemeral(context: Mapping[str, str], driver: str) -> Refusal | None:
    if context.get(contract.EPHEMERAL_KEY) != "true":
        return Refusal(RefusalCode.FAILED_PRECONDITION,
                       f"{driver} serves only CSI inline ephemeral volumes (pod.spec.volumes[].csi, written by the "
                       "gpufrac webhook); it cannot back a PersistentVolume")
    return None


def requested_mode(context: Mapping[str, str]) -> ComputeMode | Refusal:
    accepted = " or ".join(ComputeMode)
    value = context.get(contract.MODE_ATTRIBUTE)
    if not value:
        return Refusal(RefusalCode.INVALID_ARGUMENT,
                       f"volumeAttributes.{contract.MODE_ATTRIBUTE} is missing; set it to {accepted}")
    try:
        return ComputeMode(value)
    except ValueError:
        return Refusal(RefusalCode.INVALID_ARGUMENT,
                       f"volumeAttributes.{contract.MODE_ATTRIBUTE}: {value!r} is not a compute mode; "
                       f"expected {accepted}")


def pod_ref(context: Mapping[str, str], driver: str) -> PodRef | Refusal:
    keys = (contract.POD_NAMESPACE_KEY, contract.POD_NAME_KEY, contract.POD_UID_KEY)
    values = [context.get(key, "") for key in keys]
    missing = [key for key, value in zip(keys, values, strict=True) if not value]
    if missing:
        return Refusal(RefusalCode.FAILED_PRECONDITION,
                       f"the kubelet sent no pod information ({', '.join(missing)} missing): the CSIDriver "
                       f"object {driver} must set podInfoOnMount: true (the gpufrac chart installs it so)")
    return PodRef(*values)


def check_fractional(pod: Mapping[str, Any], ref: PodRef, mode: ComputeMode, driver: str) -> Refusal | None:
    """The pod must be a fractional pod admitted by the webhook, and of the mode whose directories it asks for."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    containers = read_canonical(annotations).fractions
    if not containers:
        return Refusal(RefusalCode.FAILED_PRECONDITION,
                       f"pod {ref} is not a GPU-fraction pod (it has no {CANONICAL_PREFIX}* annotations, which the "
                       f"gpufrac webhook writes on fractional pods): only fractional pods get {driver} volumes; "
                       "remove the volume, or request a GPU fraction (e.g. annotation gpu-fraction) so the "
                       "gpufrac webhook admits the pod as one")
    modes = sorted({c.mode for c in containers.values()})
    if mode not in modes:
        names = ", ".join(sorted(containers))
        return Refusal(RefusalCode.FAILED_PRECONDITION,
                       f"pod {ref} is a {' and '.join(modes)} GPU fraction (containers {names}) but asks for the "
                       f"{mode} MPS volume; the volume's mode must be the containers' compute mode (the gpufrac "
                       "webhook writes it so)")
    return None


def check_served(mode: ComputeMode, node: NodeDirs) -> Refusal | None:
    reason = node.not_served.get(mode, f"{mode} is not enabled on this node's agent")
    if reason is not None:
        return Refusal(RefusalCode.FAILED_PRECONDITION,
                       f"node {node.node} does not enforce {mode} fractions right now: {reason}; the kubelet retries "
                       "the mount, and the pod starts once the node's gpufrac.io/Ready condition is True")
    return None


def plan(request: PublishRequest, mode: ComputeMode, ref: PodRef, node: NodeDirs) -> PublishPlan:
    target = Path(request.target_path)
    return PublishPlan(mode, ref, (
        Bind(node.pipe_dirs[mode], target / contract.PIPE_SUBDIR, request.readonly),
        # MPS clients write their shared memory segments here, whatever the volume's access mode
        Bind(node.shm_dir, target / contract.SHM_SUBDIR, False),
    ))


def decide_request(request: PublishRequest, node: NodeDirs) -> tuple[ComputeMode, PodRef] | Refusal:
    """The rules that need no pod object: shape, ephemeral, mode, pod information."""
    refusal = check_request(request, node.driver) or check_ephemeral(request.context, node.driver)
    if refusal is not None:
        return refusal
    mode = requested_mode(request.context)
    if isinstance(mode, Refusal):
        return mode
    ref = pod_ref(request.context, node.driver)
    if isinstance(ref, Refusal):
        return ref
    return mode, ref


def decide_pod(request: PublishRequest, mode: ComputeMode, ref: PodRef, pod: Mapping[str, Any] | None,
               node: NodeDirs) -> PublishPlan | Refusal:
    """The rules on the pod (as the API server has it; None: not found) and on this node's state."""
    if pod is None or (pod.get("metadata") or {}).get("uid") != ref.uid:
        return Refusal(RefusalCode.FAILED_PRECONDITION,
                       f"pod {ref} (uid {ref.uid}) was not found in the API server; it may have been deleted")
    refusal = check_fractional(pod, ref, mode, node.driver) or check_served(mode, node)
    if refusal is not None:
        return refusal
    return plan(request, mode, ref, node)
