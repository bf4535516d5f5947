"""The agent's loop: wires the pure decisions to the edges. One `tick()` is one reconciliation."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from gpufrac.agent import capabilities
from gpufrac.agent.audit import Findings, Snapshot, decide, in_fractional_container
from gpufrac.agent.csi.publish import NodeDirs, PodRef
from gpufrac.agent.errors import MpsStartError, NvmlError, ProcReadError
from gpufrac.agent.events import EventSink, ViolationRecorder, daemon_restart_event
from gpufrac.agent.external import ExternalDaemon
from gpufrac.agent.metrics import AgentMetrics
from gpufrac.agent.model import DaemonState, DaemonStatus, EnforcementViolation, GpuProcess, Inventory, ViolationKind
from gpufrac.agent.mps_config import MpsDaemonSpec, daemon_spec, memory_problem
from gpufrac.agent.node import NodePublisher, NodeSink
from gpufrac.agent.pods import index_by_container_id
from gpufrac.agent.podwatch import PodCache, PodSource
from gpufrac.agent.procfs import read_cgroup, read_environ, read_memory_limit
from gpufrac.agent.supervisor import MpsSupervisor, RestartPolicy, remove_stale
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import DEFAULT_DRIVER_NAME, DEFAULT_MPS_ROOT, Enforcement, mps_pipe_dir, mps_shm_dir

log = logging.getLogger(__name__)

# Evicting does not fix a placement the scheduler made; the other kinds are the pod's own.
EVICTABLE = frozenset(ViolationKind) - {ViolationKind.MIXED_MODES}


class DaemonOwner(StrEnum):
    """Who runs the MPS control daemons."""

    AGENT = "agent"  # the agent, as its children: they stop with it (outside Kubernetes, tests)
    EXTERNAL = "external"  # `gpufrac mps` in the gpufrac-mps DaemonSet; the agent finds and watches them


@dataclass(frozen=True)
class AgentConfig:
    node: str
    modes: tuple[ComputeMode, ...] = tuple(ComputeMode)
    mps_binary: str = "nvidia-cuda-mps-control"
    mps_root: Path = Path(DEFAULT_MPS_ROOT)
    mps_log_root: Path = Path("/var/log/gpufrac/mps")
    mps_config_dir: Path = Path("/run/gpufrac/mps-config")
    proc_root: Path = Path("/proc")
    memory_limit_file: Path = Path("/sys/fs/cgroup/memory.max")
    interval: float = 10.0
    evict_on_violation: bool = False
    restart_policy: RestartPolicy = field(default_factory=RestartPolicy)
    quit_timeout: float = 60.0
    watch_timeout: int = 300
    startup_wait: float = 10.0  # how long a first tick waits for new daemons before publishing labels
    # Published with the same status as gpufrac.io/Ready: KAI's NvFractions mode places fractions only where it is True
    extra_condition_types: tuple[str, ...] = (capabilities.KAI_CONDITION_TYPE,)
    csi_driver: str = DEFAULT_DRIVER_NAME
    mps_daemons: DaemonOwner = DaemonOwner.AGENT


class Daemon(Protocol):
    spec: MpsDaemonSpec

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def status(self) -> DaemonStatus: ...


class GpuSource(Protocol):
    def inventory(self) -> Inventory: ...

    def processes(self) -> list[GpuProcess]: ...


class KubeSink(NodeSink, EventSink, PodSource, Protocol):
    def evict_pod(self, namespace: str, name: str) -> bool: ...

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        kube: KubeSink,
        gpus: GpuSource,
        metrics: AgentMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.kube = kube
        self.gpus = gpus
        self.metrics = metrics
        self._clock = clock
        self.pods = PodCache(
            kube, config.node, watch_timeout=config.watch_timeout, on_reconnect=metrics.watch_reconnects.inc
        )
        self.publisher = NodePublisher(kube, config.node, extra_condition_types=config.extra_condition_types)
        self.recorder = ViolationRecorder(kube, config.node)
        self.supervisors: dict[ComputeMode, Daemon] = {}
        self.start_failures: dict[ComputeMode, str] = {}
        self.inventory: Inventory | None = None
        self.nvml_error: str | None = None
        self.violations: list[EnforcementViolation] = []
        self._evicted: set[str] = set()
        self._last_tick: float | None = None
        self._started = self._clock()
        self._restarts_seen: dict[ComputeMode, int] = {}
        self._unserved_cleaned: set[ComputeMode] = set()

    # ---- lifecycle ----

    def start(self) -> None:
        self._prepare_shm()
        self.pods.start()

    def _prepare_shm(self) -> None:
        """The MPS daemons' shared memory, which the CSI plugin mounts at /dev/shm in fractional containers:
        writable by clients of any UID, each keeping its own files (sticky), like /dev/shm itself."""
        shm = Path(mps_shm_dir(str(self.config.mps_root)))
        try:
            shm.mkdir(parents=True, exist_ok=True)
            shm.chmod(0o1777)
        except OSError as err:
            log.error("preparing %s: %s", shm, err)

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
        threads = [threading.Thread(target=s.stop) for s in self.supervisors.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self._update_daemon_metrics()
        enforced = self._enforcement()
        self.publisher.try_publish(
            capabilities.node_labels(self.inventory, enforced), capabilities.stopped_condition()
        )

    # ---- one reconciliation ----

    def tick(self) -> None:
        self._refresh_inventory()
        if self.inventory is not None:
            self._wait_for_daemons(self._ensure_daemons(self.inventory))
        self._update_daemon_metrics()
        enforced = self._enforcement()
        for mode in ComputeMode:
            for value in Enforcement:
                self.metrics.enforcement.labels(mode=str(mode), enforcement=str(value)).set(
                    1 if enforced[mode] is value else 0
                )
        condition = capabilities.node_condition(
            self.inventory,
            self.config.modes,
            enforced,
            self.daemon_statuses(),
            nvml_error=self.nvml_error,
            memory_problem=self._memory_problem(),
        )
        self.publisher.try_publish(capabilities.node_labels(self.inventory, enforced), condition)
        if self.inventory is not None and self.pods.synced.is_set():
            self._audit(self.inventory)
        self._last_tick = self._clock()

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

    def _ensure_daemons(self, inventory: Inventory) -> list[Daemon]:
        started: list[Daemon] = []
        mps_v3 = capabilities.has_driver_memory_limits(inventory)
        served = capabilities.modes_to_serve(inventory, self.config.modes)
        external = self.config.mps_daemons is DaemonOwner.EXTERNAL
        for mode in ComputeMode:
            if not external and mode not in served and mode not in self._unserved_cleaned:
                # a socket left from a daemon of a former driver would make this mode's clients fail, not
                # fall back; without it they run unshared, which is what the labels say
                removed = remove_stale(Path(mps_pipe_dir(str(self.config.mps_root), mode)))
                if removed:
                    log.info("%s is not served on this node; removed %s", mode, ", ".join(map(str, removed)))
                self._unserved_cleaned.add(mode)
        for mode in served:
            if mode in self.supervisors or mode in self.start_failures:
                continue
            spec = daemon_spec(
                mode,
                mps_v3=mps_v3,
                binary=self.config.mps_binary,
                mps_root=self.config.mps_root,
                log_root=self.config.mps_log_root,
                config_dir=self.config.mps_config_dir,
            )
            supervisor: Daemon
            if external:
                supervisor = ExternalDaemon(spec, self.config.proc_root)
                log.info("watching the %s MPS daemon of %s (run by the gpufrac-mps DaemonSet)", mode, spec.pipe_dir)
            else:
                supervisor = MpsSupervisor(
                    spec,
                    self.config.restart_policy,
                    quit_timeout=self.config.quit_timeout,
                    proc_root=self.config.proc_root,
                )
            try:
                supervisor.start()
            except MpsStartError as err:
                log.error("%s", err)
                self.start_failures[mode] = f"could not be prepared ({err})"
                continue
            if not external:
                log.info("started the %s MPS daemon: %s", mode, " ".join(spec.argv))
            self.supervisors[mode] = supervisor
            started.append(supervisor)
        return started

    def _wait_for_daemons(self, started: list[Daemon]) -> None:
        """Let new daemons come up before the node is labelled, so a restart does not flap the labels."""
        deadline = self._clock() + self.config.startup_wait
        for supervisor in started:
            while self._clock() < deadline:
                status = supervisor.status()
                if status.up or status.state in (DaemonState.FAILED, DaemonState.BACKOFF):
                    break
                time.sleep(0.05)

    def daemon_statuses(self) -> dict[ComputeMode, DaemonStatus]:
        statuses = {mode: s.status() for mode, s in self.supervisors.items()}
        for mode, failure in self.start_failures.items():
            statuses[mode] = DaemonStatus(mode, DaemonState.FAILED, False, 0, failure)
        return statuses

    def _update_daemon_metrics(self) -> None:
        for mode, status in self.daemon_statuses().items():
            self.metrics.daemon_up.labels(mode=str(mode)).set(1 if status.up else 0)
            seen = self._restarts_seen.get(mode, 0)
            if status.restarts > seen:
                self.metrics.daemon_restarts.labels(mode=str(mode)).inc(status.restarts - seen)
                self._restarts_seen[mode] = status.restarts
                self._record_restart(status)

    def _record_restart(self, status: DaemonStatus) -> None:
        try:
            self.kube.create_event("default", daemon_restart_event(self.config.node, status))
        except Exception as err:  # an Event is worth a warning, not a failed loop
            log.warning("recording the %s MPS daemon restart: %s", status.mode, err)

    def _enforcement(self) -> dict[ComputeMode, Enforcement]:
        if self.inventory is None:
            return dict.fromkeys(ComputeMode, Enforcement.NONE)
        return capabilities.enforcement(self.inventory, self.config.modes, self.daemon_statuses())

    def _memory_problem(self) -> str | None:
        if self.inventory is None:
            return None
        own = sum(1 for s in self.supervisors.values() if isinstance(s, MpsSupervisor))
        return memory_problem(read_memory_limit(self.config.memory_limit_file), len(self.inventory.gpus), own)

    def _audit(self, inventory: Inventory) -> None:
        """Observe (one snapshot), decide (pure), act."""
        observed = self._observe(inventory)
        if observed is None:
            self.metrics.set_usage(())  # the processes are not known: no stale series
            return
        snapshot, pods = observed
        self._act(decide(snapshot), pods)

    def _observe(self, inventory: Inventory) -> tuple[Snapshot, list[dict[str, Any]]] | None:
        """What the audit reads: NVML's processes, the pods, and /proc of the processes. None: NVML failed."""
        try:
            processes = self.gpus.processes()
        except NvmlError as err:
            log.warning("%s", err)
            return None
        pods = self.pods.snapshot()
        index = index_by_container_id(pods)
        self.metrics.unreadable_canonical.set(index.unreadable)
        cgroups: dict[int, str] = {}
        environs: dict[int, dict[str, str]] = {}
        for process in processes:
            try:
                cgroups[process.pid] = read_cgroup(self.config.proc_root, process.pid)
                if in_fractional_container(cgroups[process.pid], index.by_id):
                    environs[process.pid] = read_environ(self.config.proc_root, process.pid)
            except ProcReadError as err:  # it exited meanwhile: what was read still counts
                log.debug("%s", err)
        return Snapshot(processes, index.by_id, cgroups, environs, inventory.by_uuid()), pods

    def _act(self, findings: Findings, pods: list[dict[str, Any]]) -> None:
        """Publish what the audit found: metrics, events (once per violation), evictions when asked."""
        self.violations = findings.violations
        self.metrics.set_usage(findings.usage)
        try:
            new = self.recorder.record(self.violations)
        except Exception as err:
            log.warning("recording violations: %s", err)
            new = []
        for violation in new:
            log.warning(
                "violation %s: %s/%s: %s",
                violation.kind,
                violation.container.namespace,
                violation.container.pod,
                violation.message,
            )
            self.metrics.violations.labels(kind=str(violation.kind)).inc()
        if self.config.evict_on_violation:
            self._evict(self.violations)
        self.recorder.forget_pods({p["metadata"]["uid"] for p in pods})

    def _evict(self, violations: Sequence[EnforcementViolation]) -> None:
        for violation in violations:
            c = violation.container
            if violation.kind not in EVICTABLE or c.pod_uid in self._evicted:
                continue
            try:
                if self.kube.evict_pod(c.namespace, c.pod):
                    log.warning("evicted %s/%s: %s", c.namespace, c.pod, violation.kind)
                    self._evicted.add(c.pod_uid)
            except Exception as err:
                log.warning("evicting %s/%s: %s", c.namespace, c.pod, err)

    # ---- what the CSI node plugin asks ----

    def node_dirs(self) -> NodeDirs:
        """This node's MPS directories and, per mode, why a pod cannot get them now (None: it can)."""
        enforced = self._enforcement()
        statuses = self.daemon_statuses()
        return NodeDirs(
            node=self.config.node,
            driver=self.config.csi_driver,
            pipe_dirs={mode: Path(mps_pipe_dir(str(self.config.mps_root), mode)) for mode in ComputeMode},
            shm_dir=Path(mps_shm_dir(str(self.config.mps_root))),
            not_served={
                mode: capabilities.unserved_reason(mode, self.inventory, self.config.modes, enforced, statuses)
                for mode in ComputeMode
            },
        )

    def find_pod(self, ref: PodRef) -> dict[str, Any] | None:
        """The pod a volume is for: from the watch cache, else from the API server (the kubelet can be faster than
        the watch, and pods without the fractional label are not cached at all). Raises KubeError."""
        return self.pods.get(ref.uid) or self.kube.get_pod(ref.namespace, ref.name)

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
