"""NRI's wire protocol, as containerd 2.x speaks it to an external plugin: the one edge that touches its bytes.

One unix socket carries two logical connections through NRI's multiplexer (pkg/net/multiplex): frames of an 8-byte
big-endian header (connection id, payload length) and the payload. Connection 1 is the plugin service, which we
serve (the runtime calls Configure, Synchronize, CreateContainer, ...); connection 2 is the runtime service, which
we call (RegisterPlugin). Each connection is a byte stream of ttrpc frames: a 10-byte big-endian header (data
length, stream id, type, flags) and a protobuf `ttrpc.Request` or `ttrpc.Response`; a client's streams are odd.

The session: RegisterPlugin -> Configure (the events we want) -> Synchronize (`more` echoed) -> events. A handler
answers within the runtime's plugin_request_timeout (2 s by default), or the runtime drops the plugin and creates
the container without it; so the decisions are pure and fast, and anything slow (Kubernetes Events) is queued by
the caller. Messages are generated from the vendored api.proto (hack/grpc-stubs.sh); none is written by hand here.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol

from gpufrac.agent.decide.device_nodes import DeviceNode
from gpufrac.agent.nri.decide.creation import ContainerInfo, Injection, PodInfo, Refusal
from gpufrac.agent.nri.stubs import api_pb2, request_pb2

log = logging.getLogger(__name__)

# ---- the multiplexer ----

MUX_HEADER = struct.Struct(">II")  # connection id, payload length
PLUGIN_CONN = 1  # the plugin service: the runtime is the ttrpc client, we serve
RUNTIME_CONN = 2  # the runtime service: we are the client
TTRPC_HEADER = struct.Struct(">IIBB")  # data length, stream id, message type, flags
TTRPC_MAX_DATA = 4 << 20
MUX_MAX_PAYLOAD = TTRPC_HEADER.size + TTRPC_MAX_DATA  # what NRI's writer splits larger payloads at


class ProtocolError(Exception):
    """The peer sent bytes that are not NRI's framing: the session ends and the plugin reconnects."""


def mux_frames(conn: int, payload: bytes) -> bytes:
    """One payload on one connection, split into frames as NRI's writer splits them."""
    out = bytearray()
    for start in range(0, max(len(payload), 1), MUX_MAX_PAYLOAD):
        chunk = payload[start:start + MUX_MAX_PAYLOAD]
        out += MUX_HEADER.pack(conn, len(chunk)) + chunk
    return bytes(out)


def _take_frames(buffer: bytearray, header: struct.Struct, max_payload: int, what: str,
                 length_of: Callable[[tuple[int, ...]], int]) -> Iterator[tuple[tuple[int, ...], bytes]]:
    """The whole frames at the start of `buffer` (removed from it): (header fields, payload); a partial frame stays."""
    while len(buffer) >= header.size:
        fields = header.unpack_from(buffer)
        length = length_of(fields)
        if length > max_payload:
            raise ProtocolError(f"{what} of {length} bytes, over the {max_payload} allowed")
        end = header.size + length
        if len(buffer) < end:
            return
        payload = bytes(buffer[header.size:end])
        del buffer[:end]
        yield fields, payload


class MuxDecoder:
    """Bytes from the socket, in any pieces, to (connection id, payload) frames."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buffer += data
        frames = []
        for (conn, _), payload in _take_frames(self._buffer, MUX_HEADER, MUX_MAX_PAYLOAD, "multiplexer frame",
                                               lambda fields: fields[1]):
            if conn == 0:
                raise ProtocolError("multiplexer frame for the reserved connection 0")
            frames.append((conn, payload))
        return frames


# ---- ttrpc ----


class MessageType(IntEnum):
    REQUEST = 1
    RESPONSE = 2
    DATA = 3


@dataclass(frozen=True)
class TtrpcMessage:
    stream_id: int
    kind: int
    data: bytes
    flags: int = 0

    def encode(self) -> bytes:
        if len(self.data) > TTRPC_MAX_DATA:
            raise ProtocolError(f"ttrpc message of {len(self.data)} bytes, over the 4 MiB ttrpc allows")
        return TTRPC_HEADER.pack(len(self.data), self.stream_id, self.kind, self.flags) + self.data


class TtrpcDecoder:
    """One connection's byte stream (a message may span multiplexer frames, or share one) to ttrpc messages."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[TtrpcMessage]:
        self._buffer += data
        return [TtrpcMessage(stream_id, kind, payload, flags)
                for (_, stream_id, kind, flags), payload in _take_frames(
                    self._buffer, TTRPC_HEADER, TTRPC_MAX_DATA, "ttrpc message (4 MiB at most)",
                    lambda fields: fields[0])]


class Code(IntEnum):
    """google.rpc.Code values a response carries; containerd shows the name (`code = FailedPrecondition`)."""

    OK = 0
    INVALID_ARGUMENT = 3
    FAILED_PRECONDITION = 9
    UNIMPLEMENTED = 12
    INTERNAL = 13


def response(stream_id: int, payload: bytes = b"", code: Code = Code.OK, message: str = "") -> TtrpcMessage:
    envelope = request_pb2.Response(payload=payload)
    if code is not Code.OK:
        envelope.status.code = int(code)
        envelope.status.message = message
    return TtrpcMessage(stream_id, MessageType.RESPONSE, envelope.SerializeToString())


def request(stream_id: int, service: str, method: str, payload: bytes, timeout_ns: int = 0) -> TtrpcMessage:
    envelope = request_pb2.Request(service=service, method=method, payload=payload, timeout_nano=timeout_ns)
    return TtrpcMessage(stream_id, MessageType.REQUEST, envelope.SerializeToString())


# ---- NRI ----

# What the plugin tells the runtime in RegisterPlugin: the version of the api.proto its messages come from
# (proto/VERSIONS, github.com/containerd/nri; a test keeps the two equal).
NRI_VERSION = "v0.12.3"
PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"


class Event(IntEnum):
    """api.proto's Event: a plugin subscribes to a set of them in ConfigureResponse (bit `1 << (event - 1)`)."""

    CREATE_CONTAINER = 4
    START_CONTAINER = 6
    STOP_CONTAINER = 10
    REMOVE_CONTAINER = 11


def event_mask(events: Sequence[Event]) -> int:
    mask = 0
    for event in events:
        mask |= 1 << (event - 1)
    return mask


SUBSCRIBED = event_mask((Event.CREATE_CONTAINER, Event.START_CONTAINER, Event.STOP_CONTAINER,
                         Event.REMOVE_CONTAINER))
LIVE_STATES = frozenset({api_pb2.CONTAINER_CREATED, api_pb2.CONTAINER_PAUSED, api_pb2.CONTAINER_RUNNING})


@dataclass(frozen=True)
class SyncedContainer:
    pod: PodInfo
    container: ContainerInfo
    live: bool  # created, running or paused: it holds its devices


class Handler(Protocol):
    """What the session asks of the plugin; every call returns well within the runtime's request timeout."""

    def configured(self, runtime: str, version: str, nri_version: str, request_timeout_ms: int) -> None: ...

    def synchronize(self, containers: Sequence[SyncedContainer]) -> None: ...

    def create_container(self, pod: PodInfo, container: ContainerInfo) -> Injection | Refusal: ...

    def start_container(self, pod: PodInfo, container: ContainerInfo) -> str | None:
        """Why the container must not start (the runtime then fails its start), None when it may."""
        ...

    def container_gone(self, container_id: str) -> None: ...


def pod_info(pod: Any) -> PodInfo:
    return PodInfo(pod.namespace, pod.name, pod.uid, dict(pod.annotations), dict(pod.labels))


def container_info(container: Any) -> ContainerInfo:
    env = dict(entry.partition("=")[::2] for entry in container.env)
    return ContainerInfo(container.id, container.name, env, dict(container.annotations),
                         tuple(device.name for device in container.CDI_devices),
                         tuple(mount.destination for mount in container.mounts), tuple(container.env),
                         created_at=container.created_at / 1e9, pid=container.pid,  # NRI tells nanoseconds
                         uid=container.user.uid if container.HasField("user") else None,
                         mount_sources=tuple(mount.source for mount in container.mounts))


def adjustment(injection: Injection) -> Any:
    """The ContainerAdjustment of a decision: CDI devices, device nodes, bind mounts, env set and env removed
    (`-NAME`)."""
    adjust = api_pb2.ContainerAdjustment()
    for name in injection.cdi_devices:
        adjust.CDI_devices.add(name=name)
    for node in injection.device_nodes:
        _add_device(adjust, node)
    for mount in injection.mounts:  # the runtime removes a mount at the same destination first
        adjust.mounts.add(destination=mount.destination, type="bind", source=mount.source,
                          options=["rbind", "rprivate", "rw"])
    for key, value in injection.set_env.items():
        adjust.env.add(key=key, value=value)
    for key in injection.remove_env:
        adjust.env.add(key=f"-{key}")
    for key, value in injection.annotations.items():
        adjust.annotations[key] = value
    return adjust


def _add_device(adjust: Any, node: DeviceNode) -> None:
    device = adjust.linux.devices.add(path=node.path, type="c", major=node.major, minor=node.minor)
    device.file_mode.value = node.file_mode


class RegistrationError(Exception):
    pass


class Session:
    """One connection to the runtime, from registration until the socket closes (or `close()`)."""

    def __init__(self, sock: socket.socket, handler: Handler, name: str, index: str,
                 nri_version: str = NRI_VERSION) -> None:
        self._sock = sock
        self._handler = handler
        self._name = name
        self._index = index
        self._nri_version = nri_version
        self._write_lock = threading.Lock()
        self._mux = MuxDecoder()
        self._streams = {PLUGIN_CONN: TtrpcDecoder(), RUNTIME_CONN: TtrpcDecoder()}
        self._synced: list[SyncedContainer] = []
        self._closing = threading.Event()
        self.registered = threading.Event()
        self._methods: dict[str, Callable[[bytes], tuple[bytes, Code, str]]] = {
            "Configure": self._configure,
            "Synchronize": self._synchronize,
            "CreateContainer": self._create_container,
            "StartContainer": self._start_container,
            "StateChange": self._state_change,  # how an older runtime relays the start (and other events)
            "StopContainer": self._container_gone(api_pb2.StopContainerRequest, api_pb2.StopContainerResponse),
            "RemoveContainer": self._container_gone(api_pb2.RemoveContainerRequest, api_pb2.RemoveContainerResponse),
            "Shutdown": self._shutdown,
        }

    def close(self) -> None:
        self._closing.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def run(self) -> str:
        """Register, then serve until the runtime closes the connection; returns why the session ended."""
        register = api_pb2.RegisterPluginRequest(plugin_name=self._name, plugin_idx=self._index,
                                                 NRI_version=self._nri_version)
        self._send(RUNTIME_CONN, request(1, RUNTIME_SERVICE, "RegisterPlugin", register.SerializeToString()))
        for conn, message in self._messages():
            if conn == PLUGIN_CONN and message.kind == MessageType.REQUEST:
                self._send(PLUGIN_CONN, self._serve(message))
            elif conn == RUNTIME_CONN and message.kind == MessageType.RESPONSE and message.stream_id == 1:
                self._registered(message)
            if self._closing.is_set():
                return "closed by the plugin"
        return "the runtime closed the connection"

    def _messages(self) -> Iterator[tuple[int, TtrpcMessage]]:
        while not self._closing.is_set():
            try:
                data = self._sock.recv(1 << 16)
            except OSError as err:
                if self._closing.is_set():
                    return
                raise ProtocolError(f"reading the NRI socket: {err}") from err
            if not data:
                return
            for conn, payload in self._mux.feed(data):
                stream = self._streams.get(conn)
                if stream is None:  # as NRI's mux does: frames for a connection nobody opened are dropped
                    continue
                for message in stream.feed(payload):
                    yield conn, message

    def _send(self, conn: int, message: TtrpcMessage) -> None:
        data = mux_frames(conn, message.encode())
        with self._write_lock:
            self._sock.sendall(data)

    def _registered(self, message: TtrpcMessage) -> None:
        envelope = request_pb2.Response.FromString(message.data)
        if envelope.status.code:
            raise RegistrationError(f"the runtime refused the registration: {envelope.status.message}")
        self.registered.set()

    def _serve(self, message: TtrpcMessage) -> TtrpcMessage:
        envelope = request_pb2.Request.FromString(message.data)
        method = self._methods.get(envelope.method) if envelope.service == PLUGIN_SERVICE else None
        if method is None:
            return self._empty(message.stream_id, envelope)
        try:
            payload, code, text = method(envelope.payload)
        except Exception as err:  # a bug must refuse the container, not crash the session (fail closed)
            log.exception("NRI %s failed", envelope.method)
            return response(message.stream_id, code=Code.INTERNAL, message=f"gpufrac NRI plugin: {err}")
        return response(message.stream_id, payload, code, text)

    def _empty(self, stream_id: int, envelope: Any) -> TtrpcMessage:
        """Methods we did not subscribe to get the empty answer of their type, unknown ones Unimplemented."""
        if envelope.service == PLUGIN_SERVICE:
            answer = getattr(api_pb2, f"{envelope.method}Response", None)
            if answer is not None:
                return response(stream_id, answer().SerializeToString())
        return response(stream_id, code=Code.UNIMPLEMENTED,
                        message=f"gpufrac NRI plugin does not implement {envelope.service}/{envelope.method}")

    def _configure(self, payload: bytes) -> tuple[bytes, Code, str]:
        req = api_pb2.ConfigureRequest.FromString(payload)
        self._handler.configured(req.runtime_name, req.runtime_version, req.NRI_version, req.request_timeout)
        return api_pb2.ConfigureResponse(events=SUBSCRIBED).SerializeToString(), Code.OK, ""

    def _synchronize(self, payload: bytes) -> tuple[bytes, Code, str]:
        req = api_pb2.SynchronizeRequest.FromString(payload)
        pods = {pod.id: pod_info(pod) for pod in req.pods}
        for container in req.containers:
            pod = pods.get(container.pod_sandbox_id)
            if pod is not None:
                self._synced.append(SyncedContainer(pod, container_info(container), container.state in LIVE_STATES))
        if not req.more:  # the runtime may split a long list over several calls; `more` must be echoed
            self._handler.synchronize(self._synced)
            self._synced = []
        return api_pb2.SynchronizeResponse(more=req.more).SerializeToString(), Code.OK, ""

    def _create_container(self, payload: bytes) -> tuple[bytes, Code, str]:
        req = api_pb2.CreateContainerRequest.FromString(payload)
        result = self._handler.create_container(pod_info(req.pod), container_info(req.container))
        if isinstance(result, Refusal):
            return b"", Code.FAILED_PRECONDITION, result.message
        return api_pb2.CreateContainerResponse(adjust=adjustment(result)).SerializeToString(), Code.OK, ""

    def _start_container(self, payload: bytes) -> tuple[bytes, Code, str]:
        req = api_pb2.StartContainerRequest.FromString(payload)
        why_not = self._handler.start_container(pod_info(req.pod), container_info(req.container))
        if why_not is not None:
            return b"", Code.FAILED_PRECONDITION, why_not
        return api_pb2.StartContainerResponse().SerializeToString(), Code.OK, ""

    def _state_change(self, payload: bytes) -> tuple[bytes, Code, str]:
        event = api_pb2.StateChangeEvent.FromString(payload)
        if event.event == Event.START_CONTAINER:
            why_not = self._handler.start_container(pod_info(event.pod), container_info(event.container))
            if why_not is not None:
                return b"", Code.FAILED_PRECONDITION, why_not
        return api_pb2.Empty().SerializeToString(), Code.OK, ""

    def _container_gone(self, request_type: Any, response_type: Any) -> Callable[[bytes], tuple[bytes, Code, str]]:
        def handle(payload: bytes) -> tuple[bytes, Code, str]:
            self._handler.container_gone(request_type.FromString(payload).container.id)
            return response_type().SerializeToString(), Code.OK, ""
        return handle

    def _shutdown(self, payload: bytes) -> tuple[bytes, Code, str]:
        log.info("the runtime asked the NRI plugin to shut down; reconnecting")
        self._closing.set()
        return api_pb2.Empty().SerializeToString(), Code.OK, ""
