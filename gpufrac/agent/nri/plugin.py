"""The agent's NRI plugin: keeps the runtime connection up, remembers which GPU serves which mode, and asks the
pure decision (`nri.decision.decide`) about each container the runtime creates.

- Reconnects at once when the socket closes: while the plugin is away the runtime creates containers without it
  (NRI fails open; containerd's `default_validator` with `required_plugins` closes that, docs/install.md). Back,
  it stops the fractions created meanwhile (`nri.decide.sweep`): when it was last present it knows from its own
  session, and across a restart from the heartbeat it writes into its lock file. NRI's runtime service ignores a
  plugin's unsolicited evictions, so it stops one by killing its first process (as the agent's over-limit action
  kills a process), after checking that the process's cgroup names the container; the kubelet creates it again.
- Never two instances under one name (two registrations of one name make every creation fail): an instance
  holds a lock file on the host, and a second one (a rolling update's overlap) waits for it.
- A refusal is answered at once; its Kubernetes Event and the metrics are the caller's (`DecisionSink`), which
  queues them, since the runtime waits for the answer (plugin_request_timeout, 2 s by default).
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from enum import StrEnum
from typing import IO, Protocol

from gpufrac.agent.decide.errors import ProcReadError
from gpufrac.agent.decide.proc_text import container_ids_in_cgroup
from gpufrac.agent.edges.kubelet_checkpoint import KubeletCheckpoint
from gpufrac.agent.edges.procfs import read_cgroup
from gpufrac.agent.nri.config import NriConfig
from gpufrac.agent.nri.decide.creation import (
    ContainerInfo,
    Injection,
    NodeFacts,
    Outcome,
    PodInfo,
    Policy,
    Refusal,
    ServingContainer,
    decide,
    serving_container,
)
from gpufrac.agent.nri.decide.daemon_side import daemon_limits_refusal, own_pipe_dir
from gpufrac.agent.nri.decide.sweep import Unserved, unserved
from gpufrac.agent.nri.wire import ProtocolError, RegistrationError, Session, SyncedContainer

log = logging.getLogger(__name__)

HEARTBEAT_S = 2.0  # how often a registered plugin writes the time into its lock file


def _last_heartbeat(text: str) -> float | None:
    """The heartbeat a lock file holds (`<pid>\\n<epoch seconds>`), None when it holds none."""
    lines = text.split()
    try:
        return float(lines[1]) if len(lines) > 1 else None
    except ValueError:
        return None


class PluginState(StrEnum):
    STARTING = "starting"
    WAITING_LOCK = "waiting-lock"  # another instance on this node holds the lock
    NO_SOCKET = "no-socket"  # the runtime has no NRI socket (containerd 1.x, or NRI disabled)
    CONNECTING = "connecting"
    REGISTERED = "registered"
    STOPPED = "stopped"


class DecisionSink(Protocol):
    """Where each decision goes besides the runtime: metrics, a Warning Event for a refusal. Must not block."""

    def decided(self, pod: PodInfo, container: ContainerInfo, result: Injection | Refusal) -> None: ...

    def state_changed(self, state: PluginState) -> None: ...

    def swept(self, found: Unserved) -> None:
        """A fraction created while the plugin was away, and whether the plugin stopped it (its message says)."""
        ...


class NriPlugin:
    def __init__(self, config: NriConfig, facts: Callable[[], NodeFacts], sink: DecisionSink,
                 hold: Callable[[PodInfo, ServingContainer, float], str | None] = lambda *_: None,
                 route: Callable[[PodInfo, ServingContainer], str | None] = lambda *_: None) -> None:
        self.config = config
        self._facts = facts
        self._sink = sink
        # Before a fraction's creation is answered: its limits set where its process cannot raise them (the MPS
        # daemon's side), within the seconds given; why they could not be, and the creation is refused (None: they
        # are, or need not be).
        self._hold = hold
        self._route = route  # an sm-sharing fraction's own MPS namespace directory, once held (None: none)
        self._policy = Policy(config.void_env_grants, config.trusted_namespaces)
        self._checkpoint = KubeletCheckpoint(config.device_checkpoint)  # read at each creation: allocated just before
        self._lock = threading.Lock()
        self._serving: dict[str, ServingContainer] = {}
        self._session: Session | None = None
        self._lock_file: IO[str] | None = None
        self.state = PluginState.STARTING
        self.runtime = ""
        self.sessions = 0  # registrations so far: one per connection
        self._request_timeout_s = 2.0  # the runtime's answer deadline, as Configure tells it
        self.present_until: float | None = None  # when this plugin (or the one before it here) was last registered
        # As of the last Synchronize: since when the plugin was away, less the slack (nri.decide.sweep); None: not known
        self._away_since: float | None = None

    # ---- the Handler the wire session calls ----

    def configured(self, runtime: str, version: str, nri_version: str, request_timeout_ms: int) -> None:
        log.info("NRI plugin %s-%s registered with %s %s (NRI %s, request timeout %d ms)", self.config.index,
                 self.config.name, runtime, version, nri_version or "unknown", request_timeout_ms)
        self.runtime = f"{runtime} {version}"
        self._request_timeout_s = request_timeout_ms / 1000 if request_timeout_ms > 0 else 2.0
        self.sessions += 1
        self._set_state(PluginState.REGISTERED)

    def synchronize(self, containers: Sequence[SyncedContainer]) -> None:
        gpus = self._facts().gpus
        serving = {}
        for synced in containers:
            held = serving_container(synced.pod, synced.container, gpus) if synced.live else None
            if held is not None:
                serving[held.container_id] = held
        with self._lock:
            self._serving = serving
        log.info("NRI synchronized: %d containers, %d GPU fractions among them", len(containers), len(serving))
        away_since = None if self.present_until is None else \
            self.present_until - self._request_timeout_s - HEARTBEAT_S - 1.0
        self._away_since = away_since
        for each in unserved([(s.pod, s.container) for s in containers if s.live], away_since, self._judge):
            if each.container.pid <= 0:
                log.info("NRI: %s; it has not started: its start is refused", each.message)
                continue  # start_container refuses it, with the Event
            why_not = self._stop(each.container)
            done = replace(each, message=each.message + (
                "; so the plugin stopped it, and the kubelet creates it again through the plugin" if why_not is None
                else f"; it could not be stopped: {why_not}"))
            log.warning("NRI: %s", done.message)
            self._sink.swept(done)

    def _stop(self, container: ContainerInfo) -> str | None:
        """Kill the container's first process (its PID namespace goes with it); why not, or None when done."""
        try:
            if container.id not in container_ids_in_cgroup(read_cgroup(self.config.proc_root, container.pid)):
                return f"process {container.pid} is no longer the container's"
            os.kill(container.pid, signal.SIGKILL)
        except (ProcReadError, OSError) as err:
            return str(err)
        return None

    def _judge(self, pod: PodInfo, container: ContainerInfo) -> Outcome:
        """What a creation of this container would get now (the sweep's question for one that is no fraction)."""
        with self._lock:
            return decide(pod, container, self._creation_facts(), self._policy).outcome

    def _creation_facts(self) -> NodeFacts:
        return replace(self._facts(), serving=tuple(self._serving.values()), allocations=self._checkpoint.allocations())

    def create_container(self, pod: PodInfo, container: ContainerInfo) -> Injection | Refusal:
        with self._lock:  # one decision at a time: two creations must not both take a GPU for different modes
            facts = self._creation_facts()
            result = decide(pod, container, facts, self._policy)
            if isinstance(result, Injection) and result.serving is not None:
                # half the runtime's deadline: an answer later than it lets the container through unchanged
                why_not = self._hold(pod, result.serving, self._request_timeout_s / 2)
                if why_not is None:
                    self._serving[container.id] = result.serving
                    namespace_dir = self._route(pod, result.serving)
                    if namespace_dir is not None:
                        result = own_pipe_dir(result, container, namespace_dir)
                else:
                    result = daemon_limits_refusal(pod, container, why_not)
        self._sink.decided(pod, container, result)
        return result

    def start_container(self, pod: PodInfo, container: ContainerInfo) -> str | None:
        """A fraction created while the plugin was away and not started when it came back (the sweep had no process
        to stop): its start is refused, and the kubelet creates it again, through the plugin. One the plugin served
        carries its mark."""
        found = unserved([(pod, container)], self._away_since, self._judge)
        if not found:
            return None
        refused = replace(found[0], message=found[0].message + "; so the plugin refused its start, and the kubelet "
                          "creates it again through the plugin")
        log.warning("NRI: %s", refused.message)
        self._sink.swept(refused)
        return refused.message

    def container_gone(self, container_id: str) -> None:
        with self._lock:
            self._serving.pop(container_id, None)

    def serving(self) -> tuple[ServingContainer, ...]:
        with self._lock:
            return tuple(self._serving.values())

    # ---- the connection ----

    def run(self, stop: threading.Event) -> None:
        """Hold the node's lock, then stay registered until `stop`: reconnect at once after a disconnect."""
        if not self._take_lock(stop):
            return
        beat = threading.Thread(target=self._heartbeat, args=(stop,), name="nri-heartbeat", daemon=True)
        beat.start()
        failures = 0
        try:
            while not stop.is_set():
                ended = self._connect_once(stop)
                failures = 0 if ended else failures + 1
                if failures and not stop.is_set():
                    stop.wait(min(self.config.retry_interval, 0.05 * 2 ** failures))
        finally:
            self._set_state(PluginState.STOPPED)
            self._release_lock()

    def stop(self) -> None:
        session = self._session
        if session is not None:
            session.close()

    def _connect_once(self, stop: threading.Event) -> bool:
        """One session; True when it was registered (so reconnecting at once is right)."""
        path = self.config.socket_path
        if not path.exists():
            if self.state is not PluginState.NO_SOCKET:
                log.warning("no NRI socket at %s (containerd 1.x, or NRI disabled): containers get their GPU "
                            "through NVIDIA_VISIBLE_DEVICES only; waiting for it", path)
            self._set_state(PluginState.NO_SOCKET)
            stop.wait(self.config.retry_interval)
            return False
        self._set_state(PluginState.CONNECTING)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
        except OSError as err:
            log.warning("connecting to the NRI socket %s: %s", path, err)
            sock.close()
            return False
        session = Session(sock, self, self.config.name, self.config.index)
        self._session = session
        if stop.is_set():
            session.close()
        try:
            why = session.run()
            log.warning("NRI session ended: %s; reconnecting", why)
        except (ProtocolError, RegistrationError, OSError) as err:
            log.warning("NRI session failed: %s; reconnecting", err)
        finally:
            self._session = None
            sock.close()
            if session.registered.is_set():
                self.present_until = time.time()
        return session.registered.is_set()

    def _set_state(self, state: PluginState) -> None:
        if state is not self.state:
            self.state = state
            self._sink.state_changed(state)

    def _take_lock(self, stop: threading.Event) -> bool:
        """Wait for the node's plugin lock (flock: released by the kernel when its holder dies)."""
        path = self.config.lock_file
        if path is None:
            return True
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(path, "a+")  # held until the plugin stops
        except OSError as err:
            log.error("cannot open the NRI plugin lock %s: %s; not registering", path, err)
            return False
        waited = False
        while not stop.is_set():
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not waited:
                    log.warning("another gpufrac NRI plugin holds %s on this node; waiting for it to stop", path)
                    self._set_state(PluginState.WAITING_LOCK)
                    waited = True
                stop.wait(0.2)
                continue
            handle.seek(0)
            self.present_until = _last_heartbeat(handle.read())  # the plugin before this one on the node
            self._lock_file = handle
            self._write_lock_file(None)
            return True
        handle.close()
        return False

    def _heartbeat(self, stop: threading.Event) -> None:
        """While registered, the time into the lock file: a plugin after this one (a restart) tells from it since
        when containers were created without a plugin."""
        while not stop.wait(HEARTBEAT_S):
            if self.state is PluginState.REGISTERED:
                self._write_lock_file(time.time())

    def _write_lock_file(self, heartbeat: float | None) -> None:
        handle = self._lock_file
        if handle is None:
            return
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.getpid()}\n" + (f"{heartbeat:.3f}\n" if heartbeat is not None else ""))
            handle.flush()
        except (OSError, ValueError) as err:  # ValueError: closed meanwhile (the plugin stopping)
            log.debug("writing the NRI plugin lock file: %s", err)

    def _release_lock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()  # closing the descriptor releases the flock
            self._lock_file = None

