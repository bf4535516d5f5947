"""The kubelet's DRAPlugin v1 service and the plugin Registration service (gRPC edge), shaped like the kubelet
plugin of NVIDIA's DRA driver: every claim of a call gets an answer (its devices, or its error), never the call an
error, so one bad claim does not hold back the others."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from gpufrac.agent.dra.decide.claims import ClaimRef
from gpufrac.agent.dra.stubs import dra_pb2, dra_pb2_grpc

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
