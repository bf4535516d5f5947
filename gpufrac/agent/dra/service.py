"""The DRA door: `gpufrac agent --dra` runs the driver (dra.driver), its kubelet plugin and its slice publisher
beside the node core, and tells the core what it holds (node.doors.FrontDoor): its prepared claims as tenants, the
GPUs it serves, who holds each time-slicing claim, and what keeps its front door from working.
"""

from __future__ import annotations

import argparse
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufrac.agent.decide import capabilities
from gpufrac.agent.decide.claim_holders import ClaimHolder
from gpufrac.agent.decide.claim_tenants import ClaimTenants
from gpufrac.agent.decide.front_door import dra_served
from gpufrac.agent.decide.mps_namespaces import too_long
from gpufrac.agent.dra.decide.cdi_dirs import cdi_dir_problem
from gpufrac.agent.dra.decide.prepare import DraNode
from gpufrac.agent.dra.decide.shared_claims import time_slicing_holders
from gpufrac.agent.dra.decide.slices import DRIVER
from gpufrac.agent.dra.decide.tenants import claim_tenants
from gpufrac.agent.dra.driver import DraDriver, FrontDoorWatch, NodeHolds, dra_node
from gpufrac.agent.dra.files import DEFAULT_CDI_DIR, DEFAULT_STATE_FILE, ClaimSpecs, StateFile
from gpufrac.agent.edges.cdi_specs import DEFAULT_CDI_DIRS, CdiSpecs
from gpufrac.agent.edges.kubelet_checkpoint import KubeletCheckpoint
from gpufrac.agent.node.doors import DoorFactory, DoorReport, NodeView
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import FRONT_DOOR_LABEL, FrontDoor, mps_pipe_dir

if TYPE_CHECKING:
    from gpufrac.agent.dra.health_watch import GpuHealthWatch
    from gpufrac.agent.dra.plugin import DraPlugin


def add_dra_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dra", action=argparse.BooleanOptionalAction, default=False,
                        help=f"serve the DRA driver {DRIVER}: publish this node's GPUs as ResourceSlices and prepare "
                             "the ResourceClaims the scheduler allocates on them (Kubernetes 1.36+: consumable "
                             "capacity)")
    parser.add_argument("--dra-state-file", type=Path, default=DEFAULT_STATE_FILE, metavar="PATH",
                        help="the claims this node prepared, read back after a restart (a host path)")
    parser.add_argument("--dra-default-front-door", choices=[door.value for door in FrontDoor],
                        default=FrontDoor.DRA.value,
                        help=f"with --dra, how a node without the label {FRONT_DOOR_LABEL} hands out its GPUs: "
                             "ResourceClaims (dra) or annotated fractions (annotations); one front door per GPU")
    parser.add_argument("--dra-cdi-dir", type=Path, default=DEFAULT_CDI_DIR, metavar="PATH",
                        help="where each claim's CDI spec is written (one of the runtime's cdi_spec_dirs)")
    parser.add_argument("--dra-cdi-host-dir", metavar="PATH",
                        help="that directory's path on the host, where it is mounted elsewhere in the agent's "
                             "container (default: --dra-cdi-dir)")
    parser.add_argument("--dra-runtime-cdi-dir", action="append", metavar="PATH",
                        help="a directory the container runtime reads CDI specs from (its cdi_spec_dirs; "
                             "repeatable; default: the --cdi-spec-dir ones, else /etc/cdi and /var/run/cdi); "
                             "the driver refuses claims while --dra-cdi-host-dir is not among them")


class DraService:
    """The driver, its gRPC plugin and its slice publisher, started and stopped with the agent: the DRA door."""

    def __init__(self, driver: DraDriver, plugin: DraPlugin, interval: float, front_door: FrontDoorWatch,
                 health: GpuHealthWatch | None = None, *, node: NodeView | None = None,
                 cdi_problem: str | None = None) -> None:
        self.driver = driver
        self.health = health
        self.plugin = plugin
        self.front_door = front_door
        self._node = node
        self._cdi_problem = cdi_problem
        self._interval = interval
        self._stop = threading.Event()
        self._publisher = threading.Thread(target=driver.keep_published,
                                           args=(self._stop, interval, front_door.refresh),
                                           name="dra-slices", daemon=True)

    # ---- the door (node.doors.FrontDoor) ----

    def tenants(self) -> ClaimTenants:
        return claim_tenants(self.driver.claims())  # held like annotated fractions

    def held_gpus(self) -> dict[str, str]:
        """What the NRI plugin refuses annotated fractions on: every GPU of a DRA node, and those claims hold."""
        inventory = self._node.inventory if self._node is not None else None
        gpus = inventory.gpus if inventory is not None else ()
        return dra_served(self.front_door.choice, [gpu.uuid for gpu in gpus], self.driver.claimed_gpus())

    def claim_holders(self) -> dict[str, ClaimHolder]:
        return time_slicing_holders(self.driver.claims())  # a time-slicing claim serves one pod

    def report(self) -> DoorReport:
        # said on the node's condition, from the agent's first pass on: before any claim is placed
        problems = (self.front_door.choice.problem, self._cdi_problem, self.driver.api_problem)
        return DoorReport(problem="; ".join(p for p in problems if p) or None)

    def start(self) -> None:
        self.front_door.refresh()  # before the kubelet's first Prepare
        if self.health is not None:
            self.health.start()
        self.plugin.start()
        self._publisher.start()

    def stop(self) -> None:
        """Prepared claims stay (their containers keep running); the kubelet retires the slices of a driver gone."""
        self._stop.set()
        self.plugin.stop()
        self._publisher.join(timeout=self._interval + 5)
        if self.health is not None:
            self.health.stop()


def dra_door(args: argparse.Namespace, api_client: Any) -> DoorFactory | None:
    """The DRA door the agent is built with (`--dra`), None without it."""
    return (lambda node: dra_service(args, node, api_client)) if args.dra else None


def dra_service(args: argparse.Namespace, view: NodeView, api_client: Any) -> DraService:
    from gpufrac.agent.dra.health_watch import GpuHealthWatch
    from gpufrac.agent.dra.kube import DraKube
    from gpufrac.agent.dra.plugin import DraPlugin, plugin_paths

    config = view.config
    cdi = CdiSpecs(args.cdi_spec_dir or DEFAULT_CDI_DIRS)
    kube = DraKube(api_client)
    door = FrontDoorWatch(lambda: kube.node_labels(config.node), FrontDoor(args.dra_default_front_door))

    runtime_dirs = [str(d) for d in (args.dra_runtime_cdi_dir or args.cdi_spec_dir or DEFAULT_CDI_DIRS)]
    cdi_problem = cdi_dir_problem(str(args.dra_cdi_host_dir or args.dra_cdi_dir), runtime_dirs)
    checkpoint = KubeletCheckpoint(args.nri_device_checkpoint)

    def listed() -> tuple[str, ...]:
        return tuple(sorted(gpu.uuid for gpu in view.inventory.gpus)) if view.inventory is not None else ()

    health = GpuHealthWatch(listed)

    def holds() -> NodeHolds:
        # before the agent's first pass has judged a mode, it is not offered
        unenforced = {str(mode): view.not_served.get(mode, "the agent has not judged it yet") for mode in ComputeMode}
        ids = checkpoint.allocations().allocated()
        gpus = view.inventory.gpus if view.inventory is not None else ()
        plugin = {g.uuid: "allocated whole by the kubelet, its device checkpoint says" for g in gpus
                  if g.uuid in ids or str(g.index) in ids}
        # as the agent's MPS limits give namespaces (Agent.hold_now): a claim's spec mounts its own
        namespaces = view.inventory is not None and capabilities.has_driver_memory_limits(view.inventory) and \
            too_long(mps_pipe_dir(str(config.mps_root), ComputeMode.SM_SHARING)) is None
        return NodeHolds({mode: why for mode, why in unenforced.items() if why}, plugin, health.lost(), cdi_problem,
                         namespaces)

    def node() -> DraNode | None:
        served = [str(mode) for mode, status in view.daemon_statuses().items() if status.up]
        placed = view.pod_fractions() if view.pods_synced() else ()
        return dra_node(config.node, view.inventory, view.guarantee_labels(), str(config.mps_root), served,
                        cdi.names(), front_door=door.choice, placed=placed, holds=holds())

    def driver_version() -> str:
        return view.inventory.driver_version if view.inventory is not None else ""

    driver = DraDriver(node, kube, ClaimSpecs(args.dra_cdi_dir), StateFile(args.dra_state_file), driver_version,
                       hold=view.hold_now)
    endpoint, registration = plugin_paths(args.kubelet_dir, DRIVER)
    plugin = DraPlugin(DRIVER, endpoint, registration, driver, on_registered=driver.republish)
    return DraService(driver, plugin, max(config.interval, 5.0), door, health, node=view, cdi_problem=cdi_problem)
