"""Serves the DRA plugin on its unix socket and announces it on the kubelet's plugin registration socket (edge).

Layout the kubelet expects (k8s.io/dynamic-resource-allocation/kubeletplugin does the same):
  <kubelet dir>/plugins/<driver>/dra.sock             DRAPlugin v1, dialled by the kubelet
  <kubelet dir>/plugins_registry/<driver>-reg.sock    Registration, found by the kubelet's plugin watcher
"""

from __future__ import annotations

import logging
import stat
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

from gpufrac.agent.decide.errors import ConfigError
from gpufrac.agent.edges.dra.services import ClaimHandler, DraPluginService, RegistrationService
from gpufrac.agent.edges.dra.stubs import dra_pb2_grpc, pluginregistration_pb2_grpc

log = logging.getLogger(__name__)


def plugin_paths(kubelet_dir: Path, driver: str) -> tuple[Path, Path]:
    """The DRA socket and the registration socket of a driver under the kubelet's root directory."""
    return kubelet_dir / "plugins" / driver / "dra.sock", kubelet_dir / "plugins_registry" / f"{driver}-reg.sock"


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


class DraPlugin:
    def __init__(self, driver: str, endpoint: Path, registration_socket: Path | None, handler: ClaimHandler,
                 on_registered: Callable[[], None] = lambda: None) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.registration_socket = registration_socket  # None: do not register (tests dial the DRA socket)
        self.service = DraPluginService(handler)
        self.registration = RegistrationService(driver, endpoint, on_registered)
        self._servers: list[tuple[grpc.Server, Path]] = []

    def start(self) -> None:
        """The DRA socket first: the kubelet dials it as soon as it sees the registration socket."""
        self._servers.append((_serve(self.endpoint, lambda server: dra_pb2_grpc.add_DRAPluginServicer_to_server(
            self.service, server)), self.endpoint))
        log.info("DRA driver %s serving on %s", self.driver, self.endpoint)
        if self.registration_socket is not None:
            socket = self.registration_socket
            self._servers.append((_serve(socket, lambda server: pluginregistration_pb2_grpc
                                         .add_RegistrationServicer_to_server(self.registration, server)), socket))
            log.info("DRA driver %s announced to the kubelet on %s", self.driver, socket)

    def stop(self, grace: float = 2.0) -> None:
        """Registration socket first: its removal makes the kubelet deregister the driver (prepared claims stay)."""
        for server, socket in reversed(self._servers):
            server.stop(grace).wait()
            socket.unlink(missing_ok=True)
        self._servers.clear()
