"""The Registration service the kubelet's plugin watcher asks on the registration socket (gRPC edge): who the
plugin is, of which type, where its own socket is, and whether the kubelet took it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from gpufrac.agent.kubelet_plugin.stubs import pluginregistration_pb2, pluginregistration_pb2_grpc

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PluginInfo:
    kind: str  # as the log says it: "CSI", "DRA"
    type: str  # k8s.io/kubelet/pkg/apis/pluginregistration/v1: CSIPlugin, DRAPlugin
    driver: str
    endpoint: Path  # the plugin's own socket, as the kubelet sees it
    versions: tuple[str, ...]


class RegistrationService(pluginregistration_pb2_grpc.RegistrationServicer):
    def __init__(self, info: PluginInfo, on_registered: Callable[[], None] = lambda: None) -> None:
        self._info = info
        self._on_registered = on_registered
        self.registered = threading.Event()
        self.error: str | None = None

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (the proto's name)
        info = self._info
        return pluginregistration_pb2.PluginInfo(type=info.type, name=info.driver, endpoint=str(info.endpoint),
                                                 supported_versions=list(info.versions))

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (the proto's name)
        info = self._info
        if request.plugin_registered:
            self.error = None
            self.registered.set()
            log.info("the kubelet registered %s driver %s (endpoint %s)", info.kind, info.driver, info.endpoint)
            self._on_registered()
        else:
            self.error = request.error or "no reason given"
            self.registered.clear()
            log.error("the kubelet refused to register %s driver %s: %s", info.kind, info.driver, self.error)
        return pluginregistration_pb2.RegistrationStatusResponse()
