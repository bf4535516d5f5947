"""Serves the CSI plugin on its unix socket and announces it on the kubelet's plugin registration socket (edge).

Layout the kubelet expects (csi-driver-host-path's node-driver-registrar does the same):
  <kubelet dir>/plugins/<driver>/csi.sock             Identity + Node, dialled by the kubelet
  <kubelet dir>/plugins_registry/<driver>-reg.sock    Registration, found by the kubelet's plugin watcher
"""

from __future__ import annotations

import logging
import stat
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpufrac.agent.decide.csi_publish import NodeDirs
from gpufrac.agent.decide.errors import ConfigError
from gpufrac.agent.edges.csi.services import IdentityService, NodeService, PodFinder, RegistrationService
from gpufrac.agent.edges.csi.stubs import csi_pb2_grpc, pluginregistration_pb2_grpc

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CsiConfig:
    driver: str
    endpoint: Path  # the CSI socket as the kubelet sees it (the agent mounts the kubelet dir at the same path)
    registration_socket: Path | None  # None: do not register (the kubelet is told some other way, or tests)


def plugin_paths(kubelet_dir: Path, driver: str) -> tuple[Path, Path]:
    """The CSI socket and the registration socket of a driver under the kubelet's root directory."""
    return kubelet_dir / "plugins" / driver / "csi.sock", kubelet_dir / "plugins_registry" / f"{driver}-reg.sock"


def _clear_socket(path: Path) -> None:
    """A socket left by a previous run (the agent was killed) would make the bind fail; anything else is kept."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ConfigError(f"{path} exists and is not a socket; remove it or choose another path")
    path.unlink()


def _serve(socket: Path, register: Callable[[grpc.Server], None]) -> grpc.Server:
    socket.parent.mkdir(parents=True, exist_ok=True)
    _clear_socket(socket)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"grpc-{socket.name}"))
    register(server)
    try:
        server.add_insecure_port(f"unix://{socket}")
    except RuntimeError as err:
        raise ConfigError(f"cannot listen on {socket}: {err}") from err
    server.start()
    return server


class CsiPlugin:
    def __init__(self, config: CsiConfig, node_dirs: Callable[[], NodeDirs], find_pod: PodFinder,
                 ready: Callable[[], bool]) -> None:
        self.config = config
        self.identity = IdentityService(config.driver, ready)
        self.node = NodeService(node_dirs, find_pod)
        self.registration = RegistrationService(config.driver, config.endpoint)
        self._servers: list[tuple[grpc.Server, Path]] = []

    def start(self) -> None:
        """The CSI socket first: the kubelet dials it as soon as it sees the registration socket."""

        def csi(server: grpc.Server) -> None:
            csi_pb2_grpc.add_IdentityServicer_to_server(self.identity, server)
            csi_pb2_grpc.add_NodeServicer_to_server(self.node, server)

        self._servers.append((_serve(self.config.endpoint, csi), self.config.endpoint))
        log.info("CSI driver %s serving on %s", self.config.driver, self.config.endpoint)
        if self.config.registration_socket is not None:
            socket = self.config.registration_socket
            self._servers.append((_serve(socket, lambda server: pluginregistration_pb2_grpc
                                         .add_RegistrationServicer_to_server(self.registration, server)), socket))
            log.info("CSI driver %s announced to the kubelet on %s", self.config.driver, socket)

    def stop(self, grace: float = 2.0) -> None:
        """Registration socket first: its removal makes the kubelet deregister the driver."""
        for server, socket in reversed(self._servers):
            server.stop(grace).wait()
            socket.unlink(missing_ok=True)
        self._servers.clear()
