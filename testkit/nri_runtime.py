"""A stand-in for containerd's NRI side, for the unit and agent tests (the real containerd is in tests/node): it
listens on a unix socket, accepts a plugin, answers RegisterPlugin on connection 2 and calls the plugin service on
connection 1, as containerd's adaptation does. Speaks in the generated messages; frames with the wire module."""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpufrac.agent.nri.stubs import api_pb2, request_pb2
from gpufrac.agent.nri.wire import (
    PLUGIN_CONN,
    PLUGIN_SERVICE,
    RUNTIME_CONN,
    MessageType,
    MuxDecoder,
    TtrpcDecoder,
    TtrpcMessage,
    mux_frames,
    request,
    response,
)


class FakeRuntime:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(4)
        self.conn: socket.socket | None = None
        self.registration: Any = None
        self._mux = MuxDecoder()
        self._streams = {PLUGIN_CONN: TtrpcDecoder(), RUNTIME_CONN: TtrpcDecoder()}
        self._pending: list[tuple[int, TtrpcMessage]] = []
        self._next_stream = 1
        self.lock = threading.Lock()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.server.close()

    def drop(self) -> None:
        """Close the plugin's connection, as containerd does when it stops."""
        assert self.conn is not None
        self.conn.shutdown(socket.SHUT_RDWR)
        self.conn.close()
        self.conn = None

    def accept(self, timeout: float = 5.0) -> Any:
        """Accept a plugin and answer its RegisterPlugin; returns the RegisterPluginRequest."""
        self.server.settimeout(timeout)
        self.conn, _ = self.server.accept()
        self.conn.settimeout(timeout)
        self._mux, self._pending = MuxDecoder(), []
        self._streams = {PLUGIN_CONN: TtrpcDecoder(), RUNTIME_CONN: TtrpcDecoder()}
        self._next_stream = 1
        message = self._receive(RUNTIME_CONN)
        envelope = request_pb2.Request.FromString(message.data)
        assert (envelope.service, envelope.method) == ("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin")
        self.registration = api_pb2.RegisterPluginRequest.FromString(envelope.payload)
        self._send(RUNTIME_CONN, response(message.stream_id, api_pb2.Empty().SerializeToString()))
        return self.registration

    def call(self, method: str, message: Any) -> Any:
        """Call the plugin service; returns the ttrpc Response envelope."""
        stream = self._next_stream
        self._next_stream += 2  # a client's streams are odd
        self._send(PLUGIN_CONN, request(stream, PLUGIN_SERVICE, method, message.SerializeToString(), 2_000_000_000))
        answer = self._receive(PLUGIN_CONN)
        assert answer.stream_id == stream and answer.kind == MessageType.RESPONSE
        return request_pb2.Response.FromString(answer.data)

    def handshake(self, pods: Sequence[Any] = (), containers: Sequence[Any] = (),
                  request_timeout_ms: int = 2000) -> int:
        """Configure then Synchronize, as containerd does after registration (its plugin_request_timeout: 2 s by
        default); returns the subscribed event mask."""
        configured = self.call("Configure", api_pb2.ConfigureRequest(
            runtime_name="containerd", runtime_version="v2.4.2", registration_timeout=5000,
            request_timeout=request_timeout_ms, NRI_version="v0.12.3"))
        assert configured.status.code == 0, configured.status.message
        events = api_pb2.ConfigureResponse.FromString(configured.payload).events
        synced = self.call("Synchronize", api_pb2.SynchronizeRequest(pods=pods, containers=containers))
        assert synced.status.code == 0, synced.status.message
        return int(events)

    def create(self, pod: Any, container: Any) -> Any:
        return self.call("CreateContainer", api_pb2.CreateContainerRequest(pod=pod, container=container))

    def start(self, pod: Any, container: Any) -> Any:
        return self.call("StartContainer", api_pb2.StartContainerRequest(pod=pod, container=container))

    def _send(self, conn: int, message: TtrpcMessage) -> None:
        assert self.conn is not None
        self.conn.sendall(mux_frames(conn, message.encode()))

    def _receive(self, conn: int) -> TtrpcMessage:
        assert self.conn is not None
        while True:
            for i, (c, message) in enumerate(self._pending):
                if c == conn:
                    del self._pending[i]
                    return message
            data = self.conn.recv(1 << 16)
            if not data:
                raise ConnectionError("the plugin closed the connection")
            for c, payload in self._mux.feed(data):
                self._pending += [(c, m) for m in self._streams[c].feed(payload)]


def pod_sandbox(name: str, uid: str, annotations: dict[str, str], namespace: str = "team-a",
                labels: dict[str, str] | None = None) -> Any:
    return api_pb2.PodSandbox(id=f"sandbox-{uid}", name=name, uid=uid, namespace=namespace, annotations=annotations,
                              labels=labels or {})


def nri_container(container_id: str, name: str, pod: Any, env: dict[str, str],
                  state: int = 0, *, created_at: float = 0.0, annotations: dict[str, str] | None = None,
                  pid: int = 0) -> Any:
    """`created_at`: seconds since the epoch (NRI carries nanoseconds); `pid`: its first process's."""
    return api_pb2.Container(id=container_id, name=name, pod_sandbox_id=pod.id, state=state,
                             env=[f"{k}={v}" for k, v in env.items()], created_at=int(created_at * 1e9),
                             annotations=annotations or {}, pid=pid)

