"""Keeps the sm-sharing MPS daemon's own limits in step with the node's sm-sharing fractions (decide.mps_limits).

Each pass plans the daemon-side limits from the running fractional containers and, when the plan changed or a new
server appeared, tells the daemon: the defaults for the next server it spawns, and each running server by PID (the
defaults do not reach a server already running), and again when the daemon was restarted (a daemon forgets its
defaults on exit: a new control socket is a new daemon). What it could not tell, and what the daemon side does not hold,
is `problem`, for the node's condition.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from gpufrac.agent.decide.model import GpuInfo, RunningContainer
from gpufrac.agent.decide.mps_limits import DaemonPlan, holds, plan
from gpufrac.agent.edges.mps_control import MpsControlError, send_all, server_pids
from gpufrac.core.contract import MPS_CONTROL_SOCKET

log = logging.getLogger(__name__)


class DaemonSideLimits:
    def __init__(self, binary: str, pipe_dir: Path) -> None:
        self.binary = binary
        self.pipe_dir = pipe_dir
        # the daemon (its control socket), its servers and the plan it last took
        self._told: tuple[tuple[int, int], tuple[int, ...], DaemonPlan] | None = None
        self.problem: str | None = None  # for the node's condition: what the daemon side does not hold now

    def apply(self, containers: Iterable[RunningContainer], gpus: Sequence[GpuInfo]) -> DaemonPlan:
        wanted = plan(containers, gpus)
        if not wanted.ceilings and wanted.thread_percent is None:
            self.problem = holds(wanted, applied=True)
            return wanted
        try:
            servers = tuple(server_pids(self.binary, self.pipe_dir))
            told = (self._daemon(), servers, wanted)
            if self._told != told:
                send_all(self.binary, self.pipe_dir, wanted.default_commands() + wanted.server_commands(servers))
                log.info("sm-sharing MPS daemon limits: %s", "; ".join(wanted.default_commands()),
                         extra={"servers": list(servers)})
                self._told = told
        except MpsControlError as err:
            log.warning("%s", err)
            self._told = None
            self.problem = f"{holds(wanted, applied=False)} ({err})"
            return wanted
        self.problem = holds(wanted, applied=True)
        return wanted

    def _daemon(self) -> tuple[int, int]:
        try:
            socket = os.stat(self.pipe_dir / MPS_CONTROL_SOCKET)
        except OSError:
            return (0, 0)
        return (socket.st_ino, socket.st_ctime_ns)  # an inode may be reused; with its change time, not at once
