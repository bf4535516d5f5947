"""Keeps the sm-sharing MPS daemon's own limits in step with the node's sm-sharing fractions (decide.mps_limits).

Each pass plans the daemon-side limits from the running fractional containers and, when the plan changed or a new
server appeared, tells the daemon: the defaults for the next server it spawns, and each running server by PID (the
defaults do not reach a server already running), and again when the daemon was restarted (a daemon forgets its
defaults on exit: a new control socket is a new daemon). What it could not tell, and what the daemon side does not hold,
is `problem`, for the node's condition.

On MPS v3 (`namespaces`), each sm-sharing container also gets a namespace of its own with its own limits
(decide.mps_namespaces): the daemon's namespaces are listed once per daemon, then created, set and deleted to follow
the node's containers; `route` says which directory the NRI plugin mounts as a container's pipe directory.

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

from gpufrac.agent.decide import mps_namespaces
from gpufrac.agent.decide.model import GpuInfo, RunningContainer
from gpufrac.agent.decide.mps_limits import DaemonPlan, holds, plan
from gpufrac.agent.decide.mps_namespaces import Namespace
from gpufrac.agent.edges.mps_control import MpsControlError, invoke, invoke_all, send_all, server_pids
from gpufrac.core.contract import MPS_CONTROL_SOCKET

log = logging.getLogger(__name__)

CREATED_TTL_S = 120.0  # how long a fraction held at its creation counts without the pod watch having its pod
# A namespace whose container left but whose clients are still attached (a terminating pod in its grace period, 30 s
# by default, then the kubelet's kill): `namespace delete` is refused until they go, and after this long it is
# deleted with `--force`. Meanwhile it stays, and nothing else waits for it.
FORCE_AFTER_S = 60.0


class DaemonSideLimits:
    def __init__(self, binary: str, pipe_dir: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.binary = binary
        self.pipe_dir = pipe_dir
        self._clock = clock
        self._lock = threading.Lock()  # the loop's pass and the NRI plugin's creations
        self._created: dict[tuple[str, str, str], tuple[RunningContainer, float]] = {}  # key -> (it, until)
        # the daemon (its control socket), its servers and the plan it last took
        self._told: tuple[tuple[int, int], tuple[int, ...], DaemonPlan] | None = None
        # the daemon whose namespaces of ours are known, and those (None: created, limits not known)
        self._namespaces: tuple[tuple[int, int], dict[str, Namespace | None]] | None = None
        self._leaving: dict[str, float] = {}  # namespace -> when its deletion was first tried
        self._server_told: tuple[tuple[int, int], tuple[str, ...]] | None = None
        self._first_listing = True  # an agent (re)started: the namespaces it finds were set by the one before
        self.problem: str | None = None  # for the node's condition: what the daemon side does not hold now
        self.failure: str | None = None  # why the daemon did not take the last plan (None: it did)

    def apply(self, containers: Iterable[RunningContainer], gpus: Sequence[GpuInfo], *,
              namespaces: bool = False) -> DaemonPlan:
        """The loop's pass: tell the daemon the plan for `containers` (the node's placed fractions) and the fractions
        created lately that `containers` do not hold yet; with `namespaces` (MPS v3), one namespace per container."""
        with self._lock:
            return self._apply(self._with_created(list(containers), ()), gpus, None, namespaces)

    def hold(self, containers: Iterable[RunningContainer], gpus: Sequence[GpuInfo],
             created: Iterable[RunningContainer], within_s: float | None, *, namespaces: bool = False) -> str | None:
        """At a creation: as `apply`, with the fractions being `created`, all of it within `within_s` seconds if
        given (the NRI plugin's answer has a deadline), waiting for a pass under way no longer than that. Why the
        daemon did not take the plan (None: it did)."""
        deadline = None if within_s is None else time.monotonic() + within_s
        if not self._lock.acquire(timeout=-1 if within_s is None else within_s):
            return f"the agent's pass was still telling the MPS daemon its limits after {within_s:.1f} s"
        try:
            self._apply(self._with_created(list(containers), created), gpus, deadline, namespaces)
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

    def route(self, pod_uid: str, container: str) -> Path | None:
        """The pipe directory of a container's own namespace, where the daemon has it (None: no namespace here)."""
        known = self._namespaces  # without the lock (a pass may be waiting on the daemon): each pass replaces it whole
        namespace = known[1].get(mps_namespaces.namespace_name(pod_uid, container)) if known is not None else None
        return self.pipe_dir / namespace.pipe_subdir if namespace is not None else None

    def _apply(self, containers: list[RunningContainer], gpus: Sequence[GpuInfo],
               deadline: float | None, namespaces: bool) -> DaemonPlan:
        wanted = plan(containers, gpus)
        too_long = mps_namespaces.too_long(str(self.pipe_dir)) if namespaces else None
        namespaces = namespaces and too_long is None
        per_container = mps_namespaces.wanted(containers) if namespaces else {}
        self.failure = None
        daemon = self._daemon()
        try:
            self._tell_servers(daemon, wanted, deadline)
            if namespaces:
                if deadline is None:  # a creation has its own namespace: the pass tells the server
                    self._tell_server(daemon, wanted, deadline)
                self._tell_namespaces(daemon, per_container, deadline)
            else:
                self._namespaces = None
        except MpsControlError as err:
            log.warning("%s", err)
            self._told = None
            self._namespaces = None  # listed again: a command may have half happened
            self.failure = str(err)
            self.problem = f"{holds(wanted, applied=False)} ({err})"
            return wanted
        held = holds(wanted, applied=True, routed=frozenset(ns.container for ns in per_container.values()))
        self.problem = "; ".join(p for p in (held, too_long) if p) or None
        return wanted

    def _tell_servers(self, daemon: tuple[int, int], wanted: DaemonPlan, deadline: float | None) -> None:
        """Each GPU's server limits: the defaults for the next server, and each running server by PID."""
        if not wanted.ceilings and wanted.thread_percent is None:
            return
        if deadline is not None and self._told is not None and self._told[0] == daemon and self._told[2] == wanted:
            # Within a deadline (a creation), the same plan to the same daemon needs no command: its running servers
            # were told, and a server it spawned since took the defaults.
            return
        servers = tuple(server_pids(self.binary, self.pipe_dir, deadline=deadline))
        told = (daemon, servers, wanted)
        if self._told != told:
            send_all(self.binary, self.pipe_dir, wanted.default_commands() + wanted.server_commands(servers),
                     deadline=deadline)
            log.info("sm-sharing MPS daemon limits: %s", "; ".join(wanted.default_commands()),
                     extra={"servers": list(servers)})
            self._told = told

    def _tell_server(self, daemon: tuple[int, int], wanted: DaemonPlan, deadline: float | None) -> None:
        """`server set` on gpufrac's server, so its `default` namespace gives no more than the largest fraction."""
        command = mps_namespaces.server_set(max((c.pinned_mib for c in wanted.ceilings), default=None),
                                            wanted.thread_percent)
        if command is not None and self._server_told != (daemon, command):
            invoke(self.binary, self.pipe_dir, command, deadline=deadline)
            self._server_told = (daemon, command)

    def _tell_namespaces(self, daemon: tuple[int, int], wanted: dict[str, Namespace],
                         deadline: float | None) -> None:
        """One namespace per container with its limits; ours that no container needs are deleted."""
        if self._namespaces is None or self._namespaces[0] != daemon:
            answer = invoke(self.binary, self.pipe_dir, mps_namespaces.list_command(), deadline=deadline)
            listed = mps_namespaces.listed(answer)
            # A container's namespace is named from its pod UID and name, whose limits never change: one a former
            # agent made holds them already, and is not set again (on 615 `namespace set` fails while its
            # clients run). A daemon listed again later (a restart, a failed command) is set again.
            self._namespaces = (daemon, {name: wanted.get(name) if self._first_listing else None for name in listed})
            self._first_listing = False
        has = self._namespaces[1]
        todo = mps_namespaces.changes(has, wanted)
        staying = self._leave(todo.delete, deadline)
        commands = todo.making()
        if commands:
            invoke_all(self.binary, self.pipe_dir, commands, deadline=deadline)
        if commands or len(staying) < len(todo.delete):
            log.info("sm-sharing MPS namespaces: %d created, %d set, %d deleted", len(todo.create), len(todo.update),
                     len(todo.delete) - len(staying), extra={"new_namespaces": [ns.container for ns in todo.create]})
        self._namespaces = (daemon, {**{name: has[name] for name in staying}, **wanted})

    def _leave(self, names: Sequence[str], deadline: float | None) -> list[str]:
        """Deletes the namespaces no container needs, those whose clients are gone, or with `--force` FORCE_AFTER_S
        after the first try; returns those that stay. A creation (`deadline`) deletes none: the pass does."""
        if deadline is not None:
            return list(names)
        now, staying = self._clock(), []
        for name in names:
            first = self._leaving.setdefault(name, now)
            try:
                force = now - first >= FORCE_AFTER_S
                invoke(self.binary, self.pipe_dir, mps_namespaces.delete_command(name, force=force))
                del self._leaving[name]
            except MpsControlError as err:
                log.info("sm-sharing MPS namespace %s stays for now: %s", name, err)
                staying.append(name)
        return staying

    def _daemon(self) -> tuple[int, int]:
        try:
            socket = os.stat(self.pipe_dir / MPS_CONTROL_SOCKET)
        except OSError:
            return (0, 0)
        return (socket.st_ino, socket.st_ctime_ns)  # an inode may be reused; with its change time, not at once
