"""The CSI node plugin, served for real on unix sockets, driven by a real gRPC client, making real bind mounts."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpufrac.agent.csi import mounts
from gpufrac.agent.csi.decide.publish import NodeDirs, PodRef
from gpufrac.agent.csi.plugin import CsiConfig, CsiPlugin, plugin_paths
from gpufrac.agent.csi.stubs import csi_pb2, csi_pb2_grpc
from gpufrac.agent.kubelet_plugin.stubs import pluginregistration_pb2, pluginregistration_pb2_grpc
from gpufrac.core.annotations import ComputeMode
from testkit.agent import canonical_annotations, cid, pod

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")

DRIVER = "mps.gpufrac.io"


@dataclass
class Node:
    root: Path
    sockets: Path
    dirs: NodeDirs
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    lookups: list[PodRef] = field(default_factory=list)

    def find_pod(self, ref: PodRef) -> dict[str, Any] | None:
        self.lookups.append(ref)
        return self.pods.get(ref.uid)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Unix socket paths must stay under 108 bytes: pytest's tmp_path is too deep."""
    path = Path(tempfile.mkdtemp(prefix="csi-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node(tmp_path: Path, short_dir: Path) -> Iterator[Node]:
    mps = short_dir / "mps"
    pipe_dirs = {mode: mps / str(mode) for mode in ComputeMode}
    for directory in (*pipe_dirs.values(), mps / "shm"):
        directory.mkdir(parents=True)
    # what a running MPS control daemon leaves in its pipe directory: its control socket
    for mode, directory in pipe_dirs.items():
        with socket.socket(socket.AF_UNIX) as control:
            control.bind(str(directory / "control"))
        (directory / "daemon.txt").write_text(f"{mode} daemon\n")
    dirs = NodeDirs("gpu-node-1", DRIVER, pipe_dirs, mps / "shm", dict.fromkeys(ComputeMode))
    yield Node(tmp_path, short_dir, dirs)
    for path in sorted(tmp_path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir() and mounts.is_mount_point(path):
            mounts.unmount(path)


@pytest.fixture
def plugin(node: Node) -> Iterator[CsiPlugin]:
    endpoint, registration = plugin_paths(node.sockets / "kubelet", DRIVER)
    csi = CsiPlugin(CsiConfig(DRIVER, endpoint, registration), lambda: node.dirs, node.find_pod, lambda: True)
    csi.start()
    yield csi
    csi.stop(0)


@pytest.fixture
def channel(plugin: CsiPlugin) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"unix://{plugin.config.endpoint}") as ch:
        yield ch


def fractional_pod(name: str, uid: str, mode: str) -> dict[str, Any]:
    return pod(name, uid=uid, containers={"app": cid(1)},
               annotations=canonical_annotations("app", request_mib=2048, limit_mib=4096, devices=["GPU-a"], mode=mode))


def volume_context(name: str, uid: str, mode: str = "sm-sharing", **extra: str) -> dict[str, str]:
    return {"mode": mode, "csi.storage.k8s.io/pod.name": name, "csi.storage.k8s.io/pod.namespace": "team-a",
            "csi.storage.k8s.io/pod.uid": uid, "csi.storage.k8s.io/ephemeral": "true",
            "csi.storage.k8s.io/serviceAccount.name": "default", **extra}


def publish_request(target: Path, context: dict[str, str], *, block: bool = False, readonly: bool = False) -> Any:
    capability = csi_pb2.VolumeCapability(
        access_mode=csi_pb2.VolumeCapability.AccessMode(mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER))
    if block:
        capability.block.SetInParent()
    else:
        capability.mount.SetInParent()
    return csi_pb2.NodePublishVolumeRequest(volume_id="csi-0123abcd", target_path=str(target), readonly=readonly,
                                            volume_capability=capability, volume_context=context)


def publish(channel: grpc.Channel, target: Path, context: dict[str, str], **kwargs: bool) -> Any:
    return csi_pb2_grpc.NodeStub(channel).NodePublishVolume(publish_request(target, context, **kwargs), timeout=10)


def unpublish(channel: grpc.Channel, target: Path) -> Any:
    return csi_pb2_grpc.NodeStub(channel).NodeUnpublishVolume(
        csi_pb2.NodeUnpublishVolumeRequest(volume_id="csi-0123abcd", target_path=str(target)), timeout=10)


def refused(channel: grpc.Channel, target: Path, context: dict[str, str], **kwargs: bool) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        publish(channel, target, context, **kwargs)
    return caught.value


def test_identity_and_node_info_name_the_driver_and_the_node(channel: grpc.Channel) -> None:
    identity = csi_pb2_grpc.IdentityStub(channel)
    info = identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest(), timeout=10)
    assert info.name == DRIVER and info.vendor_version
    assert identity.Probe(csi_pb2.ProbeRequest(), timeout=10).ready.value is True
    node = csi_pb2_grpc.NodeStub(channel)
    assert node.NodeGetInfo(csi_pb2.NodeGetInfoRequest(), timeout=10).node_id == "gpu-node-1"
    assert list(node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest(), timeout=10).capabilities) == []


def test_registration_socket_tells_the_kubelet_where_the_csi_socket_is(plugin: CsiPlugin) -> None:
    socket_path = plugin.config.registration_socket
    assert socket_path is not None and socket_path.name == f"{DRIVER}-reg.sock"
    with grpc.insecure_channel(f"unix://{socket_path}") as ch:
        stub = pluginregistration_pb2_grpc.RegistrationStub(ch)
        info = stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=10)
        assert (info.type, info.name, info.endpoint) == ("CSIPlugin", DRIVER, str(plugin.config.endpoint))
        assert list(info.supported_versions) == ["1.0.0"]
        stub.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=10)
    assert plugin.registration.registered.is_set()


def test_publish_mounts_the_modes_pipe_and_shared_memory_and_unpublish_undoes_it(node: Node,
                                                                                channel: grpc.Channel) -> None:
    node.pods["u1"] = fractional_pod("infer", "u1", "sm-sharing")
    target = node.root / "pods/u1/volumes/kubernetes.io~csi/gpufrac-mps-sm-sharing/mount"
    publish(channel, target, volume_context("infer", "u1"))
    assert (target / "pipe/daemon.txt").read_text() == "sm-sharing daemon\n"
    assert (target / "pipe/control").is_socket()
    assert mounts.is_mount_point(target / "pipe") and mounts.is_mount_point(target / "shm")
    (target / "shm/segment").write_text("x")  # clients write shared memory the daemon sees
    assert (node.dirs.shm_dir / "segment").read_text() == "x"

    publish(channel, target, volume_context("infer", "u1"))  # the kubelet retries: nothing stacks up
    mountinfo = Path("/proc/self/mountinfo").read_text()
    assert mountinfo.count(f" {target}/pipe ") == 1

    unpublish(channel, target)
    assert not target.exists()
    assert (node.dirs.pipe_dirs[ComputeMode.SM_SHARING] / "daemon.txt").exists(), "the source is left intact"
    assert (node.dirs.shm_dir / "segment").exists()
    unpublish(channel, target)  # again: still fine


def test_readonly_volume_mounts_the_pipe_directory_read_only(node: Node, channel: grpc.Channel) -> None:
    node.pods["u1"] = fractional_pod("train", "u1", "time-slicing")
    target = node.root / "t/mount"
    publish(channel, target, volume_context("train", "u1", mode="time-slicing"), readonly=True)
    assert (target / "pipe/daemon.txt").read_text() == "time-slicing daemon\n"
    with pytest.raises(OSError, match="Read-only"):
        (target / "pipe/new").write_text("x")
    (target / "shm/segment").write_text("x")
    unpublish(channel, target)


def test_a_pod_that_is_not_fractional_is_refused(node: Node, channel: grpc.Channel) -> None:
    plain = pod("web", uid="u2", containers={"app": cid(2)}, annotations={})
    node.pods["u2"] = plain
    target = node.root / "t2/mount"
    error = refused(channel, target, volume_context("web", "u2"))
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "pod team-a/web is not a GPU-fraction pod" in error.details()
    assert "gpufrac.io/container.*" in error.details()
    assert not (target / "pipe").exists()


def test_a_pod_of_the_other_mode_is_refused(node: Node, channel: grpc.Channel) -> None:
    node.pods["u3"] = fractional_pod("train", "u3", "time-slicing")
    error = refused(channel, node.root / "t3/mount", volume_context("train", "u3", mode="sm-sharing"))
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "is a time-slicing GPU fraction (containers app) but asks for the sm-sharing MPS volume" in error.details()


def test_a_mode_the_node_does_not_enforce_is_refused_with_the_reason(node: Node, channel: grpc.Channel) -> None:
    node.pods["u4"] = fractional_pod("infer", "u4", "sm-sharing")
    node.dirs = replace(node.dirs, not_served={ComputeMode.SM_SHARING: "its MPS control daemon is backoff",
                                               ComputeMode.TIME_SLICING: None})
    target = node.root / "t4/mount"
    error = refused(channel, target, volume_context("infer", "u4"))
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert error.details().startswith("node gpu-node-1 does not enforce sm-sharing fractions right now: its MPS "
                                      "control daemon is backoff")
    node.dirs = replace(node.dirs, not_served=dict.fromkeys(ComputeMode))
    publish(channel, target, volume_context("infer", "u4"))  # the kubelet's retry succeeds once it is up
    assert (target / "pipe/control").is_socket()
    unpublish(channel, target)


@pytest.mark.parametrize(("change", "code", "text"), [
    ({"mode": "turbo"}, grpc.StatusCode.INVALID_ARGUMENT, "volumeAttributes.mode: 'turbo' is not a compute mode; "
                                                          "expected time-slicing or sm-sharing"),
    ({"mode": ""}, grpc.StatusCode.INVALID_ARGUMENT, "volumeAttributes.mode is missing"),
    ({"csi.storage.k8s.io/ephemeral": "false"}, grpc.StatusCode.FAILED_PRECONDITION,
     "serves only CSI inline ephemeral volumes"),
    ({"csi.storage.k8s.io/pod.uid": ""}, grpc.StatusCode.FAILED_PRECONDITION,
     "must set podInfoOnMount: true"),
    ({"csi.storage.k8s.io/pod.uid": "someone-else"}, grpc.StatusCode.FAILED_PRECONDITION,
     "pod team-a/infer (uid someone-else) was not found"),
])
def test_bad_volume_context_is_refused_with_what_to_do(node: Node, channel: grpc.Channel, change: dict[str, str],
                                                      code: grpc.StatusCode, text: str) -> None:
    node.pods["u5"] = fractional_pod("infer", "u5", "sm-sharing")
    error = refused(channel, node.root / "t5/mount", {**volume_context("infer", "u5"), **change})
    assert error.code() is code
    assert text in error.details()


def test_block_volumes_and_relative_targets_are_invalid(node: Node, channel: grpc.Channel) -> None:
    node.pods["u6"] = fractional_pod("infer", "u6", "sm-sharing")
    error = refused(channel, node.root / "t6", volume_context("infer", "u6"), block=True)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT and "not volumeDevices" in error.details()
    error = refused(channel, Path("relative/target"), volume_context("infer", "u6"))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT and "absolute target_path" in error.details()
    assert node.lookups == [], "malformed requests are refused before the API server is asked"


def test_a_stale_socket_from_a_killed_agent_is_replaced(node: Node) -> None:
    endpoint, registration = plugin_paths(node.sockets / "kubelet", DRIVER)
    for path in (endpoint, registration):
        path.parent.mkdir(parents=True, exist_ok=True)
        with socket.socket(socket.AF_UNIX) as stale:
            stale.bind(str(path))
    csi = CsiPlugin(CsiConfig(DRIVER, endpoint, registration), lambda: node.dirs, node.find_pod, lambda: False)
    csi.start()
    try:
        with grpc.insecure_channel(f"unix://{endpoint}") as ch:
            assert csi_pb2_grpc.IdentityStub(ch).Probe(csi_pb2.ProbeRequest(), timeout=10).ready.value is False
    finally:
        csi.stop(0)
    assert not endpoint.exists() and not registration.exists(), "stopping removes both sockets"
