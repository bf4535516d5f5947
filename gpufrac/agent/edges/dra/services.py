"""The kubelet's DRAPlugin v1 service and the plugin Registration service (gRPC edge), shaped like the kubelet
plugin of NVIDIA's DRA driver: every claim of a call gets an answer (its devices, or its error), never the call an
error, so one bad claim does not hold back the others."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from gpufrac.agent.decide.dra_claims import ClaimRef
from gpufrac.agent.edges.dra.stubs import dra_pb2, dra_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc

log = logging.getLogger(__name__)

DRA_SERVICE = "v1.DRAPlugin"  # k8s.io/kubelet/pkg/apis/dra/v1.DRAPluginService: what supported_versions lists
PLUGIN_TYPE = "DRAPlugin"  # k8s.io/kubelet/pkg/apis/pluginregistration/v1.DRAPlugin


@dataclass(frozen=True)
class DeviceAnswer:
    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None


class ClaimHandler(Protocol):
    """What the service asks the driver for each claim: its devices, or the one-line reason it was refused."""

    def prepare(self, claim: ClaimRef) -> tuple[DeviceAnswer, ...] | str: ...

    def unprepare(self, claim: ClaimRef) -> str | None: ...


def _refs(claims: Iterable[Any]) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]


def _device(answer: DeviceAnswer) -> Any:
    device = dra_pb2.Device(request_names=[answer.request], pool_name=answer.pool, device_name=answer.device,
                            cdi_device_ids=list(answer.cdi_ids))
    if answer.share_id:
        device.share_id = answer.share_id
    return device


class DraPluginService(dra_pb2_grpc.DRAPluginServicer):
    def __init__(self, handler: ClaimHandler) -> None:
        self._handler = handler

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (the proto's name)
        response = dra_pb2.NodePrepareResourcesResponse()
        for claim in _refs(request.claims):
            outcome = self._handler.prepare(claim)
            if isinstance(outcome, str):
                log.warning("NodePrepareResources refused claim %s: %s", claim, outcome)
                response.claims[claim.uid].error = outcome
            else:
                response.claims[claim.uid].devices.extend(_device(answer) for answer in outcome)
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (the proto's name)
        response = dra_pb2.NodeUnprepareResourcesResponse()
        for claim in _refs(request.claims):
            error = self._handler.unprepare(claim)
            response.claims[claim.uid].error = error or ""
            if error:
                log.warning("NodeUnprepareResources failed for claim %s: %s", claim, error)
        return response


class RegistrationService(pluginregistration_pb2_grpc.RegistrationServicer):
    """What the kubelet's plugin watcher asks on the registration socket: a DRA plugin, and where its socket is."""

    def __init__(self, driver: str, endpoint: Path, on_registered: Callable[[], None] = lambda: None) -> None:
        self._driver = driver
        self._endpoint = endpoint
        self._on_registered = on_registered
        self.registered = threading.Event()
        self.error: str | None = None

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (the proto's name)
        return pluginregistration_pb2.PluginInfo(type=PLUGIN_TYPE, name=self._driver, endpoint=str(self._endpoint),
                                                 supported_versions=[DRA_SERVICE])

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (the proto's name)
        if request.plugin_registered:
            self.error = None
            self.registered.set()
            log.info("the kubelet registered DRA driver %s (endpoint %s)", self._driver, self._endpoint)
            self._on_registered()
        else:
            self.error = request.error or "no reason given"
            self.registered.clear()
            log.error("the kubelet refused to register DRA driver %s: %s", self._driver, self.error)
        return pluginregistration_pb2.RegistrationStatusResponse()
