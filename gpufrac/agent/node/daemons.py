"""The node's MPS control daemons, one per served mode: started (as the agent's children) or found (run by
`gpufrac mps`), waited for, reported (metrics, an Event per restart) and stopped. Part of the node loop."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from gpufrac.agent.decide import capabilities
from gpufrac.agent.decide.errors import MpsStartError
from gpufrac.agent.decide.events import EventSink, daemon_restart_event
from gpufrac.agent.decide.model import DaemonState, DaemonStatus, Inventory
from gpufrac.agent.decide.mps_config import MpsDaemonSpec, daemon_spec
from gpufrac.agent.edges.external import ExternalDaemon
from gpufrac.agent.edges.metrics import AgentMetrics
from gpufrac.agent.edges.supervisor import MpsSupervisor, remove_stale
from gpufrac.agent.node.agent_config import AgentConfig, DaemonOwner
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import mps_pipe_dir, mps_shm_dir

log = logging.getLogger(__name__)


class Daemon(Protocol):
    spec: MpsDaemonSpec

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def status(self) -> DaemonStatus: ...


class MpsDaemons:
    def __init__(self, config: AgentConfig, events: EventSink, metrics: AgentMetrics, *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self._config = config
        self._events = events
        self._metrics = metrics
        self._clock = clock
        self._sleep = sleep
        self._external = config.mps_daemons is DaemonOwner.EXTERNAL
        self.supervisors: dict[ComputeMode, Daemon] = {}
        self.start_failures: dict[ComputeMode, str] = {}
        self._restarts_seen: dict[ComputeMode, int] = {}
        self._unserved_cleaned: set[ComputeMode] = set()

    def prepare_shm(self) -> None:
        """The daemons' shared memory, which the CSI plugin mounts at /dev/shm in fractional containers: writable
        by clients of any UID, each keeping its own files (sticky), like /dev/shm itself."""
        shm = Path(mps_shm_dir(str(self._config.mps_root)))
        try:
            shm.mkdir(parents=True, exist_ok=True)
            shm.chmod(0o1777)
        except OSError as err:
            log.error("preparing %s: %s", shm, err)

    def ensure(self, inventory: Inventory) -> None:
        """A daemon for each mode the GPUs can serve; new ones get up to startup_wait to come up, so that a restart
        does not flap the node's labels."""
        served = capabilities.modes_to_serve(inventory, self._config.modes)
        if not self._external:
            self._remove_unserved_sockets(served)
        started = []
        for mode in served:
            if mode not in self.supervisors and mode not in self.start_failures:
                daemon = self._start(mode, capabilities.has_driver_memory_limits(inventory))
                if daemon is not None:
                    started.append(daemon)
        self._wait_for(started)

    def _remove_unserved_sockets(self, served: tuple[ComputeMode, ...]) -> None:
        """A socket left from a daemon of a former driver would make an unserved mode's clients fail, not fall
        back; without it they run unshared, which is what the labels say."""
        for mode in ComputeMode:
            if mode in served or mode in self._unserved_cleaned:
                continue
            removed = remove_stale(Path(mps_pipe_dir(str(self._config.mps_root), mode)))
            if removed:
                log.info("%s is not served on this node; removed %s", mode, ", ".join(map(str, removed)))
            self._unserved_cleaned.add(mode)

    def _start(self, mode: ComputeMode, mps_v3: bool) -> Daemon | None:
        config = self._config
        spec = daemon_spec(mode, mps_v3=mps_v3, binary=config.mps_binary, mps_root=config.mps_root,
                           log_root=config.mps_log_root, config_dir=config.mps_config_dir)
        daemon: Daemon
        if self._external:
            daemon = ExternalDaemon(spec, config.proc_root)
            log.info("watching the %s MPS daemon of %s (run by the gpufrac-mps DaemonSet)", mode, spec.pipe_dir)
        else:
            daemon = MpsSupervisor(spec, config.restart_policy, quit_timeout=config.quit_timeout,
                                   proc_root=config.proc_root, clock=self._clock)
        try:
            daemon.start()
        except MpsStartError as err:
            log.error("%s", err)
            self.start_failures[mode] = f"could not be prepared ({err})"
            return None
        if not self._external:
            log.info("started the %s MPS daemon: %s", mode, " ".join(spec.argv))
        self.supervisors[mode] = daemon
        return daemon

    def _wait_for(self, started: list[Daemon]) -> None:
        deadline = self._clock() + self._config.startup_wait
        for daemon in started:
            while self._clock() < deadline:
                status = daemon.status()
                if status.up or status.state in (DaemonState.FAILED, DaemonState.BACKOFF):
                    break
                self._sleep(0.05)

    def statuses(self) -> dict[ComputeMode, DaemonStatus]:
        statuses = {mode: s.status() for mode, s in self.supervisors.items()}
        for mode, failure in self.start_failures.items():
            statuses[mode] = DaemonStatus(mode, DaemonState.FAILED, False, 0, failure)
        return statuses

    def own(self) -> int:
        """How many daemons are the agent's children (their memory is the agent container's)."""
        return sum(1 for s in self.supervisors.values() if isinstance(s, MpsSupervisor))

    def report(self) -> None:
        """Up per mode, and restarts since the last report: counted, and an Event each."""
        for mode, status in self.statuses().items():
            self._metrics.daemon_up.labels(mode=str(mode)).set(1 if status.up else 0)
            seen = self._restarts_seen.get(mode, 0)
            if status.restarts > seen:
                self._metrics.daemon_restarts.labels(mode=str(mode)).inc(status.restarts - seen)
                self._restarts_seen[mode] = status.restarts
                self._record_restart(status)

    def _record_restart(self, status: DaemonStatus) -> None:
        try:
            self._events.create_event("default", daemon_restart_event(self._config.node, status))
        except Exception as err:  # an Event is worth a warning, not a failed loop
            log.warning("recording the %s MPS daemon restart: %s", status.mode, err)

    def stop(self) -> None:
        """`quit` every daemon, in parallel."""
        threads = [threading.Thread(target=s.stop) for s in self.supervisors.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
