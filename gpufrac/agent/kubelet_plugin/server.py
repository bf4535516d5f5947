"""Serves a kubelet plugin on its unix socket and announces it on the kubelet's registration socket (edge)."""

from __future__ import annotations

import logging
import stat
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

from gpufrac.agent.decide.errors import ConfigError
from gpufrac.agent.kubelet_plugin.registration import PluginInfo, RegistrationService
from gpufrac.agent.kubelet_plugin.stubs import pluginregistration_pb2_grpc

log = logging.getLogger(__name__)

AddServices = Callable[[grpc.Server], None]  # adds the plugin's own servicers to its server


def plugin_paths(kubelet_dir: Path, driver: str, socket_name: str) -> tuple[Path, Path]:
    """A driver's own socket and its registration socket under the kubelet's root directory."""
    return kubelet_dir / "plugins" / driver / socket_name, kubelet_dir / "plugins_registry" / f"{driver}-reg.sock"


def _clear_socket(path: Path) -> None:
    """A socket left by a previous run (the agent was killed) would make the bind fail; anything else is kept."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ConfigError(f"{path} exists and is not a socket; remove it or choose another path")
    path.unlink()


def _serve(socket: Path, add: AddServices) -> grpc.Server:
    socket.parent.mkdir(parents=True, exist_ok=True)
    _clear_socket(socket)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"grpc-{socket.name}"))
    add(server)
    try:
        server.add_insecure_port(f"unix://{socket}")
    except RuntimeError as err:
        raise ConfigError(f"cannot listen on {socket}: {err}") from err
    server.start()
    return server


class KubeletPlugin:
    """One plugin: its services on `info.endpoint`, then (unless `registration_socket` is None: tests dial the
    plugin's socket, or the kubelet is told some other way) its Registration service."""

    def __init__(self, info: PluginInfo, add_services: AddServices, registration_socket: Path | None,
                 on_registered: Callable[[], None] = lambda: None) -> None:
        self.info = info
        self._add_services = add_services
        self.registration_socket = registration_socket
        self.registration = RegistrationService(info, on_registered)
        self._servers: list[tuple[grpc.Server, Path]] = []

    def start(self) -> None:
        """The plugin's socket first: the kubelet dials it as soon as it sees the registration socket."""
        info = self.info
        self._servers.append((_serve(info.endpoint, self._add_services), info.endpoint))
        log.info("%s driver %s serving on %s", info.kind, info.driver, info.endpoint)
        if self.registration_socket is not None:
            socket = self.registration_socket
            self._servers.append((_serve(socket, lambda server: pluginregistration_pb2_grpc
                                         .add_RegistrationServicer_to_server(self.registration, server)), socket))
            log.info("%s driver %s announced to the kubelet on %s", info.kind, info.driver, socket)

    def stop(self, grace: float = 2.0) -> None:
        """Registration socket first: its removal makes the kubelet deregister the driver."""
        for server, socket in reversed(self._servers):
            server.stop(grace).wait()
            socket.unlink(missing_ok=True)
        self._servers.clear()
