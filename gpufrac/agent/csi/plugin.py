"""The CSI plugin as a kubelet plugin (edge): its Identity and Node services on
`<kubelet dir>/plugins/<driver>/csi.sock`, registered through the kubelet plugin module (kubelet_plugin), as
csi-driver-host-path's node-driver-registrar does."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpufrac.agent.csi.decide.publish import NodeDirs
from gpufrac.agent.csi.services import CSI_VERSIONS, IdentityService, NodeService, PodFinder
from gpufrac.agent.csi.stubs import csi_pb2_grpc
from gpufrac.agent.kubelet_plugin import server
from gpufrac.agent.kubelet_plugin.registration import PluginInfo


@dataclass(frozen=True)
class CsiConfig:
    driver: str
    endpoint: Path  # the CSI socket as the kubelet sees it (the agent mounts the kubelet dir at the same path)
    registration_socket: Path | None  # None: do not register (the kubelet is told some other way, or tests)


def plugin_paths(kubelet_dir: Path, driver: str) -> tuple[Path, Path]:
    """The CSI socket and the registration socket of a driver under the kubelet's root directory."""
    return server.plugin_paths(kubelet_dir, driver, "csi.sock")


class CsiPlugin(server.KubeletPlugin):
    def __init__(self, config: CsiConfig, node_dirs: Callable[[], NodeDirs], find_pod: PodFinder,
                 ready: Callable[[], bool]) -> None:
        self.config = config
        self.identity = IdentityService(config.driver, ready)
        self.node = NodeService(node_dirs, find_pod)
        super().__init__(PluginInfo("CSI", "CSIPlugin", config.driver, config.endpoint, CSI_VERSIONS),
                         self._add_csi, config.registration_socket)

    def _add_csi(self, grpc_server: grpc.Server) -> None:
        csi_pb2_grpc.add_IdentityServicer_to_server(self.identity, grpc_server)
        csi_pb2_grpc.add_NodeServicer_to_server(self.node, grpc_server)
