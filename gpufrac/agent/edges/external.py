"""A mode's MPS control daemon run by someone else (the `gpufrac mps` container of the gpufrac-mps DaemonSet),
which the agent watches but never starts or stops: so an agent restart, upgrade or OOM kill leaves it running.

Found through /proc (hostPID: the control daemon whose environment names the mode's pipe directory) and checked
by its control socket; its supervisor's status file says why it is down. A restart is a new control daemon PID.
"""

from __future__ import annotations

import threading
from pathlib import Path

from gpufrac.agent.decide.model import DaemonState, DaemonStatus
from gpufrac.agent.decide.mps_config import MpsDaemonSpec
from gpufrac.agent.edges.mps_status import read_status
from gpufrac.agent.edges.procfs import mps_control_processes
from gpufrac.agent.edges.supervisor import is_socket

UNKNOWN_BUILD = "unknown"  # a status file without a build: a `gpufrac mps` from before builds were reported

NOT_RUNNING = (
    "is not running (no nvidia-cuda-mps-control serves {pipe_dir}); check the gpufrac-mps DaemonSet pod on this "
    "node and its log"
)


class ExternalDaemon:
    def __init__(self, spec: MpsDaemonSpec, proc_root: Path) -> None:
        self.spec = spec
        self._proc_root = proc_root
        self._lock = threading.Lock()
        self._last_pid: int | None = None
        self.restarts = 0  # new control daemon PIDs seen after the first one

    def start(self) -> None:
        """Nothing to start: adopting is finding it."""

    def stop(self) -> None:
        """Never `quit`: the daemon outlives the agent by design."""

    def status(self) -> DaemonStatus:
        pids = mps_control_processes(self._proc_root, self.spec.pipe_dir)
        pid = pids[0] if pids else None
        with self._lock:
            if pid is not None and self._last_pid is not None and pid != self._last_pid:
                self.restarts += 1
            if pid is not None:
                self._last_pid = pid
            restarts = self.restarts
        reported = read_status(self.spec.log_dir, self.spec.mode)
        if pid is not None and is_socket(self.spec.control_socket):
            return DaemonStatus(self.spec.mode, DaemonState.RUNNING, True, restarts,
                                last_exit=reported.last_exit if reported else None, pid=pid,
                                build=(reported.build if reported else None) or UNKNOWN_BUILD)
        if reported is not None and reported.state in (DaemonState.BACKOFF, DaemonState.FAILED):
            return DaemonStatus(self.spec.mode, reported.state, False, restarts, reported.failure,
                                reported.last_exit, pid)
        if pid is not None:
            return DaemonStatus(self.spec.mode, DaemonState.STARTING, False, restarts, pid=pid)
        return DaemonStatus(self.spec.mode, DaemonState.STOPPED, False, restarts,
                            last_exit=NOT_RUNNING.format(pipe_dir=self.spec.pipe_dir))

    @property
    def pid(self) -> int | None:
        return self.status().pid
