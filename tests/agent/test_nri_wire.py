"""NRI's framing (the multiplexer and ttrpc) and one plugin session against a runtime stand-in."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufrac.agent.nri.decide.creation import (
    ContainerInfo,
    DeviceNode,
    Injection,
    Outcome,
    PodInfo,
    Refusal,
    RefusalReason,
)
from gpufrac.agent.nri.stubs import api_pb2, request_pb2
from gpufrac.agent.nri.wire import (
    MUX_MAX_PAYLOAD,
    NRI_VERSION,
    SUBSCRIBED,
    TTRPC_MAX_DATA,
    Event,
    MessageType,
    MuxDecoder,
    ProtocolError,
    RegistrationError,
    Session,
    SyncedContainer,
    TtrpcDecoder,
    TtrpcMessage,
    adjustment,
    event_mask,
    mux_frames,
)
from testkit.nri_runtime import FakeRuntime, nri_container, pod_sandbox

REPO_ROOT = Path(__file__).resolve().parents[2]

# ---- framing ----


def test_the_version_we_register_with_is_the_vendored_api_protos() -> None:
    versions = dict(line.split()[:2] for line in (REPO_ROOT / "proto" / "VERSIONS").read_text().splitlines()
                    if line.strip())
    assert versions["github.com/containerd/nri"] == NRI_VERSION


def test_mux_frame_bytes_are_nris() -> None:
    # connection id and payload length, both uint32 big-endian, then the payload
    assert mux_frames(2, b"abc") == b"\x00\x00\x00\x02\x00\x00\x00\x03abc"


def test_ttrpc_frame_bytes_are_ttrpcs() -> None:
    # data length (uint32), stream id (uint32), type (1 request), flags (0), big-endian; 10 bytes of header
    assert TtrpcMessage(3, MessageType.REQUEST, b"xy").encode() == b"\x00\x00\x00\x02\x00\x00\x00\x03\x01\x00xy"


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@given(st.lists(st.tuples(st.sampled_from([1, 2]), st.binary(max_size=300)), max_size=6),
       st.lists(st.integers(min_value=0, max_value=5000), max_size=10))
def test_mux_round_trip_in_any_pieces(frames: list[tuple[int, bytes]], cuts: list[int]) -> None:
    stream = b"".join(mux_frames(c, p) for c, p in frames)
    decoder = MuxDecoder()
    out = [f for piece in _split(stream, cuts) for f in decoder.feed(piece)]
    assert out == [(c, p) for c, p in frames]


@given(st.lists(st.tuples(st.integers(min_value=1, max_value=999), st.binary(max_size=200)), max_size=5),
       st.lists(st.integers(min_value=0, max_value=3000), max_size=8))
def test_ttrpc_messages_may_span_frames_or_share_one(messages: list[tuple[int, bytes]], cuts: list[int]) -> None:
    # one connection's byte stream, carried by mux frames cut anywhere: what ttrpc reads back is the messages
    stream = b"".join(TtrpcMessage(s, MessageType.RESPONSE, d).encode() for s, d in messages)
    mux, ttrpc = MuxDecoder(), TtrpcDecoder()
    wire = b"".join(mux_frames(1, piece) for piece in _split(stream, cuts))
    out = [m for conn, payload in mux.feed(wire) for m in ttrpc.feed(payload)]
    assert [(m.stream_id, m.data) for m in out] == messages


def test_a_large_payload_is_split_as_nris_writer_splits_it() -> None:
    payload = bytes(MUX_MAX_PAYLOAD + 5)
    wire = mux_frames(1, payload)
    frames = MuxDecoder().feed(wire)
    assert [len(p) for _, p in frames] == [MUX_MAX_PAYLOAD, 5]


@pytest.mark.parametrize(("data", "says"), [
    (b"\x00\x00\x00\x00\x00\x00\x00\x01x", "reserved connection 0"),
    ((1).to_bytes(4, "big") + (MUX_MAX_PAYLOAD + 1).to_bytes(4, "big"), "over the"),
])
def test_bad_mux_frames_are_protocol_errors(data: bytes, says: str) -> None:
    with pytest.raises(ProtocolError, match=says):
        MuxDecoder().feed(data)


def test_a_ttrpc_message_over_4_mib_is_refused_both_ways() -> None:
    with pytest.raises(ProtocolError, match="4 MiB"):
        TtrpcDecoder().feed((TTRPC_MAX_DATA + 1).to_bytes(4, "big") + bytes(6))
    with pytest.raises(ProtocolError, match="4 MiB"):
        TtrpcMessage(1, MessageType.RESPONSE, bytes(TTRPC_MAX_DATA + 1)).encode()


def test_the_event_mask_is_the_api_protos_bits() -> None:
    assert event_mask([Event.CREATE_CONTAINER]) == 0x8  # containerd's own example: CreateContainer only
    assert SUBSCRIBED == 0x8 | 0x20 | 0x200 | 0x400  # create, start, stop, remove


def test_an_injection_becomes_nris_adjustment() -> None:
    adjust = adjustment(Injection(Outcome.INJECTED, cdi_devices=("nvidia.com/gpu=1",),
                                  device_nodes=(DeviceNode("/dev/nvidia1", 195, 1),),
                                  set_env={"NVIDIA_VISIBLE_DEVICES": "void"}, remove_env=("NVIDIA_IMEX_CHANNELS",)))
    assert [d.name for d in adjust.CDI_devices] == ["nvidia.com/gpu=1"]
    device = adjust.linux.devices[0]
    assert (device.path, device.type, device.major, device.minor, device.file_mode.value) == (
        "/dev/nvidia1", "c", 195, 1, 0o666)
    assert [(e.key, e.value) for e in adjust.env] == [("NVIDIA_VISIBLE_DEVICES", "void"), ("-NVIDIA_IMEX_CHANNELS", "")]


# ---- one session against the runtime stand-in ----


class RecordingHandler:
    def __init__(self, result: Injection | Refusal | Exception) -> None:
        self.result = result
        self.configured_with: tuple[str, str, str, int] | None = None
        self.synced: list[SyncedContainer] = []
        self.created: list[tuple[PodInfo, ContainerInfo]] = []
        self.gone: list[str] = []
        self.started: list[str] = []
        self.refuse_start: dict[str, str] = {}  # container ID -> why its start is refused

    def configured(self, runtime: str, version: str, nri_version: str, request_timeout_ms: int) -> None:
        self.configured_with = (runtime, version, nri_version, request_timeout_ms)

    def synchronize(self, containers: list[SyncedContainer]) -> None:
        self.synced = list(containers)

    def create_container(self, pod: PodInfo, container: ContainerInfo) -> Injection | Refusal:
        self.created.append((pod, container))
        if isinstance(self.result, Exception):
            raise self.result
        return self.result

    def start_container(self, pod: PodInfo, container: ContainerInfo) -> str | None:
        self.started.append(container.id)
        return self.refuse_start.get(container.id)

    def container_gone(self, container_id: str) -> None:
        self.gone.append(container_id)


@pytest.fixture
def runtime(tmp_path: Path) -> Any:
    fake = FakeRuntime(tmp_path / "nri.sock")
    yield fake
    fake.close()


def _session(runtime: FakeRuntime, handler: RecordingHandler) -> tuple[Session, threading.Thread, list[str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(runtime.path))
    session = Session(sock, handler, "gpufrac", "10", "v0.12.3")
    ended: list[str] = []
    thread = threading.Thread(target=lambda: ended.append(session.run()), daemon=True)
    thread.start()
    return session, thread, ended


def test_register_configure_synchronize_create(runtime: FakeRuntime) -> None:
    handler = RecordingHandler(Injection(Outcome.INJECTED, cdi_devices=("nvidia.com/gpu=1",)))
    session, thread, ended = _session(runtime, handler)
    registration = runtime.accept()
    assert (registration.plugin_name, registration.plugin_idx, registration.NRI_version) == (
        "gpufrac", "10", "v0.12.3")
    pod = pod_sandbox("infer", "u1", {"a": "b"})
    running = nri_container("c1", "app", pod, {"X": "1"}, state=api_pb2.CONTAINER_RUNNING)
    stopped = nri_container("c0", "old", pod, {}, state=api_pb2.CONTAINER_STOPPED)
    assert runtime.handshake([pod], [running, stopped]) == SUBSCRIBED
    assert session.registered.is_set()
    assert handler.configured_with == ("containerd", "v2.4.2", "v0.12.3", 2000)
    assert [(s.pod.uid, s.container.id, s.container.env, s.live) for s in handler.synced] == [
        ("u1", "c1", {"X": "1"}, True), ("u1", "c0", {}, False)]

    answer = runtime.create(pod, nri_container("c2", "app", pod, {"NVIDIA_VISIBLE_DEVICES": "a=b"}))
    assert answer.status.code == 0
    adjust = api_pb2.CreateContainerResponse.FromString(answer.payload).adjust
    assert [d.name for d in adjust.CDI_devices] == ["nvidia.com/gpu=1"]
    pod_seen, container_seen = handler.created[0]
    assert pod_seen == PodInfo("team-a", "infer", "u1", {"a": "b"})
    assert container_seen == ContainerInfo("c2", "app", {"NVIDIA_VISIBLE_DEVICES": "a=b"})  # split at the first =

    assert runtime.call("StopContainer", api_pb2.StopContainerRequest(container=running)).status.code == 0
    assert runtime.call("RemoveContainer", api_pb2.RemoveContainerRequest(container=stopped)).status.code == 0
    assert handler.gone == ["c1", "c0"]

    runtime.drop()
    thread.join(5)
    assert ended == ["the runtime closed the connection"]


def test_a_split_synchronize_is_answered_with_more_and_handled_once(runtime: FakeRuntime) -> None:
    handler = RecordingHandler(Injection(Outcome.UNTOUCHED))
    session, thread, _ = _session(runtime, handler)
    runtime.accept()
    runtime.call("Configure", api_pb2.ConfigureRequest(runtime_name="containerd"))
    pod = pod_sandbox("p", "u1", {})
    first = runtime.call("Synchronize", api_pb2.SynchronizeRequest(
        pods=[pod], containers=[nri_container("c1", "a", pod, {}, api_pb2.CONTAINER_RUNNING)], more=True))
    assert api_pb2.SynchronizeResponse.FromString(first.payload).more is True
    assert handler.synced == []
    last = runtime.call("Synchronize", api_pb2.SynchronizeRequest(
        pods=[pod], containers=[nri_container("c2", "b", pod, {}, api_pb2.CONTAINER_RUNNING)]))
    assert api_pb2.SynchronizeResponse.FromString(last.payload).more is False
    assert [s.container.id for s in handler.synced] == ["c1", "c2"]
    session.close()
    thread.join(5)


def test_a_refusal_is_a_failed_precondition_with_the_reason(runtime: FakeRuntime) -> None:
    handler = RecordingHandler(Refusal(RefusalReason.MODE_CONFLICT, "GPU 1 serves time-slicing to pod x"))
    session, thread, _ = _session(runtime, handler)
    runtime.accept()
    runtime.handshake()
    pod = pod_sandbox("p", "u1", {})
    answer = runtime.create(pod, nri_container("c1", "app", pod, {}))
    assert (answer.status.code, answer.status.message) == (9, "GPU 1 serves time-slicing to pod x")
    session.close()
    thread.join(5)


def test_a_handler_bug_refuses_the_container_and_keeps_the_session(runtime: FakeRuntime) -> None:
    handler = RecordingHandler(RuntimeError("boom"))
    _, thread, _ = _session(runtime, handler)
    runtime.accept()
    runtime.handshake()
    pod = pod_sandbox("p", "u1", {})
    answer = runtime.create(pod, nri_container("c1", "app", pod, {}))
    assert answer.status.code == 13 and "boom" in answer.status.message
    assert runtime.call("Shutdown", api_pb2.Empty()).status.code == 0  # the session is still there
    thread.join(5)
    assert not thread.is_alive()


def test_unsubscribed_methods_get_their_empty_answer_and_unknown_ones_unimplemented(runtime: FakeRuntime) -> None:
    handler = RecordingHandler(Injection(Outcome.UNTOUCHED))
    session, thread, _ = _session(runtime, handler)
    runtime.accept()
    pod = pod_sandbox("p", "u1", {})
    answer = runtime.call("RunPodSandbox", api_pb2.RunPodSandboxRequest(pod=pod))
    assert answer.status.code == 0 and answer.payload == b""
    assert runtime.call("StateChange", api_pb2.StateChangeEvent()).status.code == 0
    assert handler.started == []  # a StateChange that is no start asks nothing
    unknown = runtime.call("Frobnicate", api_pb2.Empty())
    assert unknown.status.code == 12 and "Frobnicate" in unknown.status.message
    session.close()
    thread.join(5)


def test_a_refused_registration_ends_the_session(tmp_path: Path) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(tmp_path / "s"))
    server.listen(1)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(tmp_path / "s"))
    conn, _ = server.accept()
    refused = request_pb2.Response()
    refused.status.code = 3
    refused.status.message = "invalid plugin index"
    conn.sendall(mux_frames(2, TtrpcMessage(1, MessageType.RESPONSE, refused.SerializeToString()).encode()))
    session = Session(client, RecordingHandler(Injection(Outcome.UNTOUCHED)), "gpufrac", "1", "v0.12.3")
    with pytest.raises(RegistrationError, match="invalid plugin index"):
        session.run()
    for s in (client, conn, server):
        s.close()


def test_a_start_is_refused_with_the_handlers_reason_by_either_rpc(runtime: FakeRuntime) -> None:
    """The runtime relays a container's start as StartContainer, or (an older one) as StateChange START_CONTAINER:
    either way the handler's reason fails the start, and a start it allows gets an empty answer."""
    handler = RecordingHandler(Injection(Outcome.UNTOUCHED))
    handler.refuse_start["c-away"] = "created while the plugin was away"
    session, thread, _ = _session(runtime, handler)
    runtime.accept()
    pod = pod_sandbox("p", "u1", {})
    refused = runtime.start(pod, nri_container("c-away", "app", pod, {}))
    assert (refused.status.code, refused.status.message) == (9, "created while the plugin was away")
    assert runtime.start(pod, nri_container("c-ok", "app", pod, {})).status.code == 0
    old_style = runtime.call("StateChange", api_pb2.StateChangeEvent(
        event=Event.START_CONTAINER, pod=pod, container=nri_container("c-away", "app", pod, {})))
    assert (old_style.status.code, old_style.status.message) == (9, "created while the plugin was away")
    assert handler.started == ["c-away", "c-ok", "c-away"]
    session.close()
    thread.join(5)
