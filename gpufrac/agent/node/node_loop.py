"""The agent's loop: wires the pure decisions to the edges. One `tick()` is one reconciliation: the GPUs (NVML), the
MPS daemons (node/daemons.py), the node's labels and condition, then an audit pass (node/audit_pass.py).
It is built with its front doors (node/doors.py), whose read-only view of the node it is, and answers the probes."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from gpufrac.agent.decide import capabilities, hard_limits
from gpufrac.agent.decide.claim_holders import ClaimHolder
from gpufrac.agent.decide.errors import NvmlError
from gpufrac.agent.decide.hard_limits import Boundary, WithoutHardLimit
from gpufrac.agent.decide.model import (
    DaemonStatus,
    EnforcementViolation,
    EvictionOutcome,
    Inventory,
    NodeCondition,
    RunningContainer,
)
from gpufrac.agent.decide.mps_config import memory_problem
from gpufrac.agent.decide.pods import placed_fractions
from gpufrac.agent.decide.soft_limits import ReclaimBy, reclaim_by, reclaim_note
from gpufrac.agent.edges.metrics import AgentMetrics
from gpufrac.agent.edges.node import NodePublisher, NodeSink
from gpufrac.agent.edges.podwatch import PodCache, PodSource
from gpufrac.agent.edges.procfs import read_cgroup_controllers, read_memory_limit
from gpufrac.agent.node.agent_config import AgentConfig
from gpufrac.agent.node.audit_pass import AuditKube, AuditPass, GpuSource
from gpufrac.agent.node.compute_modes import ComputeModes, ComputeModeSource
from gpufrac.agent.node.daemons import Daemon, MpsDaemons
from gpufrac.agent.node.doors import NO_CHECKS, DoorFactory, Doors, NodeChecks
from gpufrac.agent.node.guarantee import Guarantee
from gpufrac.agent.node.hard_limits import CgroupLimits, MemoryLimitSource
from gpufrac.agent.node.mps_limits import DaemonSideLimits
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.buildinfo import build
from gpufrac.core.contract import RECLAIM_BACKOFF_PREFIX, Enforcement, mps_pipe_dir
from gpufrac.kube.errors import KubeError

log = logging.getLogger(__name__)


class NodeGpus(GpuSource, ComputeModeSource, MemoryLimitSource, Protocol):
    """NVML as the loop uses it: the audit's readings, the GPUs' compute modes and the cgroups' memory limits."""


class KubeSink(NodeSink, AuditKube, PodSource, Protocol):
    def request_eviction(self, namespace: str, name: str, *, uid: str = "",
                         grace_seconds: int | None = None) -> tuple[EvictionOutcome, str]: ...

    def node_labels(self, node: str) -> dict[str, str]: ...

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...


class Agent:
    # Every attribute is its own: a door or a command that needs the agent to answer something is built with it
    # (its doors, its checks), never assigns to it (a late-bound slot) nor shadows one of its methods.
    __slots__ = ("_backoffs_adopted", "_checks", "_clock", "_enforced", "_last_tick", "_started", "audit",
                 "boundaries", "cgroup_limits", "compute_modes", "config", "daemon_limits", "daemons", "doors", "gpus",
                 "inventory", "kube", "metrics", "not_served", "nvml_error", "pods", "publisher", "reclaim_by",
                 "ticked")

    def __init__(
        self,
        config: AgentConfig,
        kube: KubeSink,
        gpus: NodeGpus,
        metrics: AgentMetrics,
        *,
        doors: Sequence[DoorFactory] = (),
        checks: NodeChecks = NO_CHECKS,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.kube = kube
        self.gpus = gpus
        self.metrics = metrics
        self._clock = clock
        self.pods = PodCache(
            kube, config.node, watch_timeout=config.watch_timeout, on_reconnect=metrics.watch_reconnects.inc
        )
        self.publisher = NodePublisher(kube, config.node, extra_condition_types=config.extra_condition_types,
                                       removable=lambda key: key.startswith(RECLAIM_BACKOFF_PREFIX))
        self.publisher.own_condition_only = checks.standing_down
        self._checks = checks
        self._backoffs_adopted = False  # the back-off labels an earlier agent left on the node, read once
        self.daemons = MpsDaemons(config, kube, metrics, clock=clock, sleep=sleep)
        # Who takes back memory above a request here (decide.soft_limits), as of the last tick
        self.reclaim_by = ReclaimBy.AGENT
        guarantee = Guarantee(kube, gpus, metrics, config.node, config.proc_root, config.guarantee, clock=clock,
                              mps_daemons=lambda: [s.pid for s in self.daemons.statuses().values() if s.pid],
                              reclaim_by=lambda: self.reclaim_by, wall_clock=wall_clock,
                              hold_off=self._publish_backoffs)
        self.audit = AuditPass(config, kube, gpus, metrics, self.pods, guarantee, lambda: self.doors.tenants(),
                               lambda: self._held_by())
        sm_pipe_dir = Path(mps_pipe_dir(str(config.mps_root), ComputeMode.SM_SHARING))
        self.daemon_limits = (DaemonSideLimits(config.mps_binary, sm_pipe_dir)
                              if ComputeMode.SM_SHARING in config.modes else None)
        self.compute_modes = ComputeModes(gpus) if ComputeMode.SM_SHARING in config.modes else None
        self.cgroup_limits = CgroupLimits(gpus, config.proc_root)
        self.boundaries: dict[ComputeMode, Boundary] = {}  # as of the last tick: the boundary labels
        self.inventory: Inventory | None = None
        self._enforced: dict[ComputeMode, Enforcement] = {}  # as of the last tick: its labels, published again
        self.nvml_error: str | None = None
        self._last_tick: float | None = None
        self._started = self._clock()
        # Per mode, why a container cannot get it now (None: it can), as of the last tick: what the NRI plugin
        # decides with (it answers the runtime within its 2 s deadline, so it does not scan /proc itself).
        self.not_served: dict[ComputeMode, str | None] = {}
        self.ticked = threading.Event()  # set after the first tick: the NRI plugin registers only then
        self.doors = Doors([build(self) for build in doors])  # last: a door may read the view it is given

    @property
    def supervisors(self) -> dict[ComputeMode, Daemon]:
        return self.daemons.supervisors

    @property
    def violations(self) -> list[EnforcementViolation]:
        """What the last audit pass found."""
        return self.audit.violations

    # ---- lifecycle ----

    def start(self) -> None:
        self.daemons.prepare_shm()
        self.pods.start()

    def run(self, stop: threading.Event) -> int:
        self.start()
        while not stop.is_set():
            try:
                self.tick()
            except Exception:
                log.exception("agent loop iteration failed")
            stop.wait(self.config.interval)
        self.shutdown()
        return 0

    def shutdown(self) -> None:
        """Stop watching, `quit` every daemon (in parallel), then mark the node unwatched."""
        self.pods.stop()
        self.daemons.stop()
        self.daemons.report()
        self.publisher.try_publish(self._labels(self._enforcement(self.daemon_statuses())),
                                   capabilities.stopped_condition())

    # ---- one reconciliation ----

    def tick(self) -> None:
        self._refresh_inventory()
        if self.inventory is not None:
            self.daemons.ensure(self.inventory)
        self.daemons.report()
        statuses = self.daemon_statuses()  # one reading: a daemon may come up between two
        enforced = self._enforced = self._enforcement(statuses)
        own_build = build(self.config.image)
        skew = capabilities.version_skew(own_build, statuses)
        self._report_enforcement(enforced, statuses, skew)
        self.not_served = self._not_served(enforced, statuses)
        skew_message = capabilities.skew_message(own_build, skew) if skew else None
        daemon_side = self._hold_daemon_side(statuses)
        self._adopt_backoffs()
        self.publisher.try_publish(self._labels(enforced),
                                   self._condition(enforced, statuses, skew_message, daemon_side))
        if self.inventory is not None and self.pods.synced.is_set():
            self.audit.run(self.inventory)
        for watch in self._checks.watches:
            try:
                watch(self)
            except Exception:  # one watch's failure (the API server away) stops neither the others nor the tick
                log.exception("agent watch %s failed", getattr(watch, "__name__", type(watch).__name__))
        self._last_tick = self._clock()
        self.ticked.set()

    def _report_enforcement(self, enforced: Mapping[ComputeMode, Enforcement],
                            statuses: Mapping[ComputeMode, DaemonStatus], skew: Collection[ComputeMode]) -> None:
        for mode in ComputeMode:
            for value in Enforcement:
                self.metrics.enforcement.labels(mode=str(mode), enforcement=str(value)).set(
                    1 if enforced[mode] is value else 0
                )
        for mode in statuses:
            self.metrics.version_skew.labels(mode=str(mode)).set(1 if mode in skew else 0)

    def _hold_daemon_side(self, statuses: Mapping[ComputeMode, DaemonStatus]) -> str | None:
        """Tells the sm-sharing daemon the limits of the fractions placed here, before their processes connect
        (node.mps_limits), and holds their GPUs in EXCLUSIVE_PROCESS (node.compute_modes); returns what
        is not held, for the condition's message."""
        modes = self._hold_compute_modes(())
        daemon = self._tell_daemon(statuses)
        cgroups = self._hold_cgroup_limits()
        return "; ".join(p for p in (daemon, modes, cgroups) if p) or None

    def _hold_cgroup_limits(self) -> str | None:
        """Each fractional container's limit on its own cgroup, through NVML, read back (node.hard_limits);
        and the boundary each mode has here, for the labels."""
        if self.inventory is None or not self.pods.synced.is_set():
            return None
        placed = self.placed()
        unable = self._cgroup_unable()
        problem = self.cgroup_limits.apply(placed, self.inventory.gpus, unable)
        self.boundaries = self.cgroup_limits.boundaries(placed, self.config.modes, capable=unable is None)
        return problem

    def _hold_compute_modes(self, created: Collection[RunningContainer]) -> str | None:
        if self.compute_modes is None or self.inventory is None or not self.pods.synced.is_set():
            return None
        return self.compute_modes.apply([*self.placed(), *created], self.inventory.gpus)

    def _tell_daemon(self, statuses: Mapping[ComputeMode, DaemonStatus]) -> str | None:
        status = statuses.get(ComputeMode.SM_SHARING)
        if (self.daemon_limits is None or self.inventory is None or status is None or not status.up
                or not self.pods.synced.is_set()):
            return None
        self.daemon_limits.apply(self.placed(), self.inventory.gpus,
                                 namespaces=capabilities.has_driver_memory_limits(self.inventory))
        return self.daemon_limits.problem

    def _held_by(self) -> dict[tuple[str, str], str]:
        if self.inventory is None:
            return {}
        return hard_limits.held_by(self.placed(), self.inventory.gpus, self.cgroup_limits.verified)

    def placed(self) -> list[RunningContainer]:
        """Every fraction bound to this node (its pods' containers, from bind on) and the DRA claims prepared here."""
        return [*placed_fractions(self.pods.snapshot()), *self.doors.tenants().tenants]

    def hold_now(self, created_pod: Mapping[str, Any] | None = None, within_s: float | None = None) -> str | None:
        """Tell the sm-sharing daemon now, not at the next pass: before the NRI plugin answers the creation of
        `created_pod`'s fraction, and after the DRA driver prepares an sm-sharing claim, so the daemon holds their
        limits from their processes' first connection; within `within_s` seconds if given. Why it could not (the
        caller then refuses, and the kubelet tries again), None when it holds them or there is no daemon side here."""
        if self.daemon_limits is None or self.inventory is None:
            return None  # no sm-sharing daemon on this node, or no GPUs read: the fraction is refused anyway
        if not self.pods.synced.is_set():
            return "the agent has not read the node's pods yet, so it cannot tell the daemon every fraction's limits"
        created = placed_fractions([created_pod]) if created_pod is not None else []
        modes = self._hold_compute_modes(created)
        if modes is not None:
            return modes
        return self.daemon_limits.hold(self.placed(), self.inventory.gpus, created, within_s,
                                       namespaces=capabilities.has_driver_memory_limits(self.inventory))

    def pipe_route(self, pod_uid: str, container: str) -> Path | None:
        """The host directory the NRI plugin mounts as an sm-sharing container's pipe directory: its own MPS v3
        namespace's (node.mps_limits.route); None: the mode's whole pipe directory stays (a legacy daemon)."""
        return self.daemon_limits.route(pod_uid, container) if self.daemon_limits is not None else None

    def _condition(self, enforced: Mapping[ComputeMode, Enforcement], statuses: Mapping[ComputeMode, DaemonStatus],
                   skew: str | None, daemon_side: str | None = None) -> NodeCondition:
        doors = self.doors.report()
        return capabilities.node_condition(
            self.inventory,
            self.config.modes,
            dict(enforced),
            dict(statuses),
            nvml_error=self.nvml_error,
            memory_problem=self._memory_problem(),
            delivery_problem=doors.delivery,
            skew=skew,
            runtime_problems=list(doors.runtime),
            daemon_side=daemon_side,
            front_door=doors.problem,
            reclaim=reclaim_note(self.reclaim_by, self.config.guarantee.reclaim.policy),
            blocking=[*doors.blocking, *(found for check in self._checks.blockers if (found := check()) is not None)],
            remarks=[found for check in self._checks.remarks if (found := check()) is not None],
            cgroup_unable=self._cgroup_unable(),
        )

    def _labels(self, enforced: dict[ComputeMode, Enforcement]) -> dict[str, str]:
        """What the node can enforce, the usable memory per GPU model (measured by the last audit) and the
        back-offs of controllers whose pods reclaim evicted here."""
        guarantee = self.audit.guarantee
        return {**capabilities.node_labels(self.inventory, enforced), **guarantee.labels,
                **guarantee.backoffs.labels(), **hard_limits.labels(self.boundaries)}

    def _publish_backoffs(self) -> bool:
        """Between two ticks, before an eviction: the node's labels with the back-offs as they are now (False: not
        written)."""
        return self.publisher.try_publish_labels(self._labels(self._enforced))

    def _adopt_backoffs(self) -> None:
        """Once: the back-offs an earlier agent left on the node are kept until they end, then taken off."""
        if self._backoffs_adopted:
            return
        try:
            labels = self.kube.node_labels(self.config.node)
        except KubeError as err:
            log.warning("reading node %s for the reclaim back-offs it holds: %s; trying again", self.config.node, err)
            return
        self.audit.guarantee.backoffs.adopt(labels)
        self.publisher.adopt(labels)
        self._backoffs_adopted = True

    def _refresh_inventory(self) -> None:
        try:
            self.inventory = self.gpus.inventory()
            self.nvml_error = None
            self.metrics.nvml_up.set(1)
        except NvmlError as err:
            log.warning("%s", err)
            self.inventory = None
            self.nvml_error = str(err)
            self.metrics.nvml_up.set(0)
            self.metrics.set_usage(())  # the last snapshot's usage is no longer known: no stale series
        self.reclaim_by = reclaim_by(self.inventory, read_cgroup_controllers(self.config.cgroup_controllers_file))

    def daemon_statuses(self) -> dict[ComputeMode, DaemonStatus]:
        return self.daemons.statuses()

    def _enforcement(self, statuses: Mapping[ComputeMode, DaemonStatus]) -> dict[ComputeMode, Enforcement]:
        if self.inventory is None:
            return dict.fromkeys(ComputeMode, Enforcement.NONE)
        return capabilities.enforcement(self.inventory, self.config.modes, statuses, self._cgroup_unable())

    def _cgroup_unable(self) -> str | None:
        """Why the driver holds no memory limit on a container's cgroup here (the probe, once per driver), None: it
        does (node.hard_limits)."""
        if self.inventory is None:
            return None
        return self.cgroup_limits.probe(self.inventory.gpus, self.inventory.driver_version)

    def _memory_problem(self) -> str | None:
        if self.inventory is None:
            return None
        return memory_problem(read_memory_limit(self.config.memory_limit_file), len(self.inventory.gpus),
                              self.daemons.own())

    # ---- what the doors read (node.doors.NodeView) ----

    def pods_synced(self) -> bool:
        return self.pods.synced.is_set()

    def pod_fractions(self) -> list[RunningContainer]:
        return placed_fractions(self.pods.snapshot())

    def serving_now(self) -> dict[ComputeMode, str | None]:
        statuses = self.daemon_statuses()  # one reading for both: a daemon may come up between two
        return self._not_served(self._enforcement(statuses), statuses)

    def usable_mib(self) -> dict[str, int]:
        return dict(self.audit.guarantee.usable_mib)

    def guarantee_labels(self) -> dict[str, str]:
        return dict(self.audit.guarantee.labels)

    def door_gpus(self) -> dict[str, str]:
        return self.doors.held_gpus()

    def claim_holders(self) -> dict[str, ClaimHolder]:
        return self.doors.claim_holders()

    def _not_served(self, enforced: Mapping[ComputeMode, Enforcement],
                    statuses: Mapping[ComputeMode, DaemonStatus]) -> dict[ComputeMode, str | None]:
        refusal = self._hard_limit_refusal()
        unable = self._cgroup_unable()
        return {mode: capabilities.unserved_reason(mode, self.inventory, self.config.modes, enforced, statuses, unable)
                or refusal for mode in ComputeMode}

    def _hard_limit_refusal(self) -> str | None:
        """With --without-hard-limit refuse: why fractions are not created here (the driver holds no cgroup limit)."""
        if self.config.without_hard_limit is not WithoutHardLimit.REFUSE or self.inventory is None:
            return None
        unable = self.cgroup_limits.probe(self.inventory.gpus, self.inventory.driver_version)
        return (f"the driver cannot hold a fraction's memory limit on its cgroup here ({unable}), and the node "
                "refuses fractions without it (--without-hard-limit refuse)") if unable else None

    def find_pod(self, namespace: str, name: str, uid: str) -> dict[str, Any] | None:
        """A pod of the node: from the watch cache, else from the API server (the kubelet can be faster than the
        watch, and pods without the fractional label are not cached at all). Raises KubeError."""
        return self.pods.get(uid) or self.kube.get_pod(namespace, name)

    # ---- probes ----

    def healthz(self) -> tuple[bool, str]:
        reference = self._last_tick if self._last_tick is not None else self._started
        stale = self._clock() - reference > max(3 * self.config.interval, 60.0)
        return (False, "the agent loop has not run recently") if stale else (True, "ok")

    def readyz(self) -> tuple[bool, str]:
        problems = []
        if self.inventory is None:
            problems.append(f"NVML unavailable: {self.nvml_error or 'not queried yet'}")
        if not self.pods.synced.is_set():
            problems.append("pod list not synced yet")
        for mode, status in self.daemon_statuses().items():
            if not status.up:
                problems.append(
                    f"{mode} MPS daemon {status.state}{f': {status.failure}' if status.failure else ''}"
                )
        if problems:
            return False, "; ".join(problems)
        return True, "ok"
