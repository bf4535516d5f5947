"""The DRA plugin as a kubelet plugin (edge): the kubelet's DRAPlugin v1 service on
`<kubelet dir>/plugins/<driver>/dra.sock`, registered through the kubelet plugin module (kubelet_plugin), as
k8s.io/dynamic-resource-allocation/kubeletplugin does. Unregistering keeps the prepared claims."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpufrac.agent.dra.services import DRA_SERVICE, PLUGIN_TYPE, ClaimHandler, DraPluginService
from gpufrac.agent.dra.stubs import dra_pb2_grpc
from gpufrac.agent.kubelet_plugin import server
from gpufrac.agent.kubelet_plugin.registration import PluginInfo


def plugin_paths(kubelet_dir: Path, driver: str) -> tuple[Path, Path]:
    """The DRA socket and the registration socket of a driver under the kubelet's root directory."""
    return server.plugin_paths(kubelet_dir, driver, "dra.sock")


class DraPlugin(server.KubeletPlugin):
    def __init__(self, driver: str, endpoint: Path, registration_socket: Path | None, handler: ClaimHandler,
                 on_registered: Callable[[], None] = lambda: None) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.service = DraPluginService(handler)
        super().__init__(PluginInfo("DRA", PLUGIN_TYPE, driver, endpoint, (DRA_SERVICE,)),
                         lambda grpc_server: dra_pb2_grpc.add_DRAPluginServicer_to_server(self.service, grpc_server),
                         registration_socket, on_registered)
