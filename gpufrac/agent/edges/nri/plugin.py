"""The agent's NRI plugin: keeps the runtime connection up, remembers which GPU serves which mode, and asks the
pure decision (`nri.decision.decide`) about each container the runtime creates.

- Reconnects at once when the socket closes: while the plugin is away the runtime creates containers without it
  (NRI fails open; containerd's `default_validator` with `required_plugins` closes that, docs/install.md).
- Never two instances under one name (two registrations of one name make every creation fail): an instance
  holds a lock file on the host, and a second one (a rolling update's overlap) waits for it.
- A refusal is answered at once; its Kubernetes Event and the metrics are the caller's (`DecisionSink`), which
  queues them, since the runtime waits for the answer (plugin_request_timeout, 2 s by default).
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from enum import StrEnum
from typing import IO, Protocol

from gpufrac.agent.decide.nri_decision import (
    ContainerInfo,
    Injection,
    NodeFacts,
    PodInfo,
    Policy,
    Refusal,
    ServingContainer,
    decide,
    serving_container,
)
from gpufrac.agent.edges.kubelet_checkpoint import KubeletCheckpoint
from gpufrac.agent.edges.nri.config import NriConfig
from gpufrac.agent.edges.nri.wire import ProtocolError, RegistrationError, Session, SyncedContainer

log = logging.getLogger(__name__)

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


class NriPlugin:
    def __init__(self, config: NriConfig, facts: Callable[[], NodeFacts], sink: DecisionSink) -> None:
        self.config = config
        self._facts = facts
        self._sink = sink
        self._policy = Policy(config.void_env_grants, config.trusted_namespaces)
        self._checkpoint = KubeletCheckpoint(config.device_checkpoint)  # read at each creation: allocated just before
        self._lock = threading.Lock()
        self._serving: dict[str, ServingContainer] = {}
        self._session: Session | None = None
        self._lock_file: IO[str] | None = None
        self.state = PluginState.STARTING
        self.runtime = ""
        self.sessions = 0  # registrations so far: one per connection

    # ---- the Handler the wire session calls ----

    def configured(self, runtime: str, version: str, nri_version: str, request_timeout_ms: int) -> None:
        log.info("NRI plugin %s-%s registered with %s %s (NRI %s, request timeout %d ms)", self.config.index,
                 self.config.name, runtime, version, nri_version or "unknown", request_timeout_ms)
        self.runtime = f"{runtime} {version}"
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

    def create_container(self, pod: PodInfo, container: ContainerInfo) -> Injection | Refusal:
        with self._lock:  # one decision at a time: two creations must not both take a GPU for different modes
            facts = replace(self._facts(), serving=tuple(self._serving.values()),
                            allocations=self._checkpoint.allocations())
            result = decide(pod, container, facts, self._policy)
            if isinstance(result, Injection) and result.serving is not None:
                self._serving[container.id] = result.serving
        self._sink.decided(pod, container, result)
        return result

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
            handle.truncate()
            handle.write(f"{os.getpid()}\n")
            handle.flush()
            self._lock_file = handle
            return True
        handle.close()
        return False

    def _release_lock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()  # closing the descriptor releases the flock
            self._lock_file = None

