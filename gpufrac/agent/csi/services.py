"""The CSI Identity and Node services and the kubelet Registration service (gRPC edge), shaped like the
kubernetes-csi sample drivers' node plugin: the decisions are in `publish`, the mounts in `mounts`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, NoReturn

import grpc

from gpufrac.agent.csi import mounts
from gpufrac.agent.csi.decide.publish import (
    NodeDirs,
    PodRef,
    PublishPlan,
    PublishRequest,
    Refusal,
    RefusalCode,
    decide_pod,
    decide_request,
)
from gpufrac.agent.csi.stubs import csi_pb2, csi_pb2_grpc
from gpufrac.core import contract
from gpufrac.kube.errors import KubeError

log = logging.getLogger(__name__)

# The CSI versions the kubelet may speak to this plugin (what PluginInfo.supported_versions lists).
CSI_VERSIONS = ("1.0.0",)

PodFinder = Callable[[PodRef], "dict[str, Any] | None"]


def vendor_version() -> str:
    try:
        return version("gpufrac")
    except PackageNotFoundError:
        return "0.0.0"


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message)
    raise AssertionError("unreachable")  # context.abort raises


def _refuse(context: grpc.ServicerContext, refusal: Refusal, where: str) -> NoReturn:
    log.warning("%s refused (%s): %s", where, refusal.code, refusal.message)
    _abort(context, getattr(grpc.StatusCode, refusal.code), refusal.message)


class IdentityService(csi_pb2_grpc.IdentityServicer):
    def __init__(self, driver: str, ready: Callable[[], bool]) -> None:
        self._driver = driver
        self._ready = ready

    def GetPluginInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return csi_pb2.GetPluginInfoResponse(name=self._driver, vendor_version=vendor_version())

    def GetPluginCapabilities(self, request: Any, context: grpc.ServicerContext) -> Any:
        # A node-only plugin: no controller service, no topology.
        return csi_pb2.GetPluginCapabilitiesResponse(capabilities=[])

    def Probe(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = csi_pb2.ProbeResponse()
        response.ready.value = self._ready()
        return response


class NodeService(csi_pb2_grpc.NodeServicer):
    """NodePublishVolume bind-mounts a mode's pipe and shared-memory directories under the target path;
    NodeUnpublishVolume undoes it. Both are idempotent, as the CSI spec asks: the kubelet retries."""

    def __init__(self, node_dirs: Callable[[], NodeDirs], find_pod: PodFinder) -> None:
        self._node_dirs = node_dirs
        self._find_pod = find_pod
        self._lock = threading.Lock()  # one mount change at a time: the kubelet may retry while one is running

    def NodeGetCapabilities(self, request: Any, context: grpc.ServicerContext) -> Any:
        # No STAGE_UNSTAGE: the kubelet calls NodePublishVolume directly.
        return csi_pb2.NodeGetCapabilitiesResponse(capabilities=[])

    def NodeGetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return csi_pb2.NodeGetInfoResponse(node_id=self._node_dirs().node)

    def NodePublishVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        node = self._node_dirs()
        if not request.HasField("volume_capability"):
            _refuse(context, Refusal(RefusalCode.INVALID_ARGUMENT, "NodePublishVolume needs a volume_capability"),
                    "NodePublishVolume")
        publish = PublishRequest(
            volume_id=request.volume_id,
            target_path=request.target_path,
            readonly=request.readonly,
            block=request.volume_capability.HasField("block"),
            context=dict(request.volume_context),
        )
        decided = decide_request(publish, node)
        if isinstance(decided, Refusal):
            _refuse(context, decided, f"NodePublishVolume {publish.volume_id}")
        mode, ref = decided
        try:
            pod = self._find_pod(ref)
        except KubeError as err:
            _refuse(context, Refusal(RefusalCode.UNAVAILABLE, f"cannot read pod {ref} from the API server ({err}); "
                                     "the kubelet retries the mount"), f"NodePublishVolume {publish.volume_id}")
        outcome = decide_pod(publish, mode, ref, pod, node)
        if isinstance(outcome, Refusal):
            _refuse(context, outcome, f"NodePublishVolume {publish.volume_id} for pod {ref}")
        with self._lock:
            try:
                self._apply(outcome)
            except (mounts.MountError, OSError) as err:
                _abort(context, grpc.StatusCode.INTERNAL, f"mounting the {mode} MPS directories for pod {ref}: {err}")
        log.info("published the %s MPS directories to pod %s at %s", mode, ref, publish.target_path)
        return csi_pb2.NodePublishVolumeResponse()

    @staticmethod
    def _apply(plan: PublishPlan) -> None:
        made: list[Path] = []
        try:
            for bind in plan.binds:
                if mounts.is_mount_point(bind.target) and mounts.shows(bind.target, bind.source):
                    continue  # published before: the kubelet retried
                mounts.unmount(bind.target)  # something else was there (a source that moved): replace it
                mounts.bind(bind.source, bind.target, readonly=bind.readonly)
                made.append(bind.target)
        except (mounts.MountError, OSError):
            for target in reversed(made):
                mounts.unmount(target)
            raise

    def NodeUnpublishVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        if not request.volume_id or not request.target_path:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "NodeUnpublishVolume needs a volume_id and a target_path")
        target = Path(request.target_path)
        with self._lock:
            try:
                for sub in (contract.PIPE_SUBDIR, contract.SHM_SUBDIR):
                    mounts.unmount(target / sub)
                    mounts.remove_dir(target / sub)
                mounts.unmount(target)
                mounts.remove_dir(target)
            except (mounts.MountError, OSError) as err:
                _abort(context, grpc.StatusCode.INTERNAL, f"unmounting {target}: {err}")
        log.info("unpublished %s from %s", request.volume_id, target)
        return csi_pb2.NodeUnpublishVolumeResponse()
