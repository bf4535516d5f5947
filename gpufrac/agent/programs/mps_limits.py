"""Keeps the sm-sharing MPS daemon's own limits in step with the node's sm-sharing fractions (decide.mps_limits).

Each pass plans the daemon-side limits from the running fractional containers and, when the plan changed or a new
server appeared, tells the daemon: the defaults for the next server it spawns, and each running server by PID (the
defaults do not reach a server already running), and again when the daemon was restarted (a daemon forgets its
defaults on exit: a new control socket is a new daemon). What it could not tell, and what the daemon side does not hold,
is `problem`, for the node's condition.

The NRI plugin also calls it before it answers the creation of an sm-sharing fraction, with that fraction as
`created`, so the daemon holds its limits from its process's first connection, not from the loop's next pass. A
created fraction is remembered until the node's pods include it (the pod watch may lag the runtime) or CREATED_TTL_S.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from gpufrac.agent.decide.model import GpuInfo, RunningContainer
from gpufrac.agent.decide.mps_limits import DaemonPlan, holds, plan
from gpufrac.agent.edges.mps_control import MpsControlError, send_all, server_pids
from gpufrac.core.contract import MPS_CONTROL_SOCKET

log = logging.getLogger(__name__)

CREATED_TTL_S = 120.0  # how long a fraction held at its creation counts without the pod watch having its pod


class DaemonSideLimits:
    def __init__(self, binary: str, pipe_dir: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.binary = binary
        self.pipe_dir = pipe_dir
        self._clock = clock
        self._lock = threading.Lock()  # the loop's pass and the NRI plugin's creations
        self._created: dict[tuple[str, str, str], tuple[RunningContainer, float]] = {}  # key -> (it, until)
        # the daemon (its control socket), its servers and the plan it last took
        self._told: tuple[tuple[int, int], tuple[int, ...], DaemonPlan] | None = None
        self.problem: str | None = None  # for the node's condition: what the daemon side does not hold now
        self.failure: str | None = None  # why the daemon did not take the last plan (None: it did)

    def apply(self, containers: Iterable[RunningContainer], gpus: Sequence[GpuInfo]) -> DaemonPlan:
        """The loop's pass: tell the daemon the plan for `containers` (the node's placed fractions) and the fractions
        created lately that `containers` do not hold yet."""
        with self._lock:
            return self._apply(self._with_created(list(containers), ()), gpus, None)

    def hold(self, containers: Iterable[RunningContainer], gpus: Sequence[GpuInfo],
             created: Iterable[RunningContainer], within_s: float | None) -> str | None:
        """At a creation: as `apply`, with the fractions being `created`, all of it within `within_s` seconds if
        given (the NRI plugin's answer has a deadline), waiting for a pass under way no longer than that. Why the
        daemon did not take the plan (None: it did)."""
        deadline = None if within_s is None else time.monotonic() + within_s
        if not self._lock.acquire(timeout=-1 if within_s is None else within_s):
            return f"the agent's pass was still telling the MPS daemon its limits after {within_s:.1f} s"
        try:
            self._apply(self._with_created(list(containers), created), gpus, deadline)
            return self.failure
        finally:
            self._lock.release()

    def _with_created(self, containers: list[RunningContainer],
                      created: Iterable[RunningContainer]) -> list[RunningContainer]:
        now = self._clock()
        for each in created:
            self._created[each.key] = (each, now + CREATED_TTL_S)
        known = {c.key for c in containers}
        self._created = {key: (c, until) for key, (c, until) in self._created.items()
                         if key not in known and until > now}
        return [*containers, *(c for c, _ in self._created.values())]

    def _apply(self, containers: list[RunningContainer], gpus: Sequence[GpuInfo],
               deadline: float | None) -> DaemonPlan:
        wanted = plan(containers, gpus)
        self.failure = None
        if not wanted.ceilings and wanted.thread_percent is None:
            self.problem = holds(wanted, applied=True)
            return wanted
        daemon = self._daemon()
        if deadline is not None and self._told is not None and self._told[0] == daemon and self._told[2] == wanted:
            # Within a deadline (a creation), the same plan to the same daemon needs no command: its running servers
            # were told, and a server it spawned since took the defaults.
            return wanted
        try:
            servers = tuple(server_pids(self.binary, self.pipe_dir, deadline=deadline))
            told = (daemon, servers, wanted)
            if self._told != told:
                send_all(self.binary, self.pipe_dir, wanted.default_commands() + wanted.server_commands(servers),
                         deadline=deadline)
                log.info("sm-sharing MPS daemon limits: %s", "; ".join(wanted.default_commands()),
                         extra={"servers": list(servers)})
                self._told = told
        except MpsControlError as err:
            log.warning("%s", err)
            self._told = None
            self.failure = str(err)
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
