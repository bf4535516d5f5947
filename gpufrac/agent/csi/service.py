"""The CSI door: `gpufrac agent --csi` serves the CSI node plugin that mounts each mode's MPS directories into
fractional pods, from the node core's view (node.doors.NodeView). It holds no GPU and places no tenant: a pod's
fraction is its annotations', which the core reads itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufrac.agent.csi.decide.publish import NodeDirs, PodRef
from gpufrac.agent.csi.plugin import CsiConfig, CsiPlugin, plugin_paths
from gpufrac.agent.node.doors import DoorFactory, HoldsNothing, NodeView
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import mps_pipe_dir, mps_shm_dir


def node_dirs(node: NodeView) -> NodeDirs:
    """This node's MPS directories and, per mode, why a pod cannot get them now (None: it can)."""
    config = node.config
    return NodeDirs(
        node=config.node,
        driver=config.csi_driver,
        pipe_dirs={mode: Path(mps_pipe_dir(str(config.mps_root), mode)) for mode in ComputeMode},
        shm_dir=Path(mps_shm_dir(str(config.mps_root))),
        not_served=node.serving_now(),
    )


def find_pod(node: NodeView, ref: PodRef) -> dict[str, Any] | None:
    """The pod a volume is for (Raises KubeError)."""
    return node.find_pod(ref.namespace, ref.name, ref.uid)


class CsiService(HoldsNothing):
    def __init__(self, node: NodeView, kubelet_dir: Path) -> None:
        endpoint, registration = plugin_paths(kubelet_dir, node.config.csi_driver)
        self.plugin = CsiPlugin(CsiConfig(node.config.csi_driver, endpoint, registration), lambda: node_dirs(node),
                                lambda ref: find_pod(node, ref), node.pods_synced)

    def start(self) -> None:
        self.plugin.start()

    def stop(self) -> None:
        self.plugin.stop()


def csi_door(kubelet_dir: Path) -> DoorFactory:
    return lambda node: CsiService(node, kubelet_dir)
