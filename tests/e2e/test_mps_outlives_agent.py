"""MPS that outlives the agent, and the agent's CSI driver, against a real kube-apiserver.

The MPS daemons run under `gpufrac mps` processes of their own (what the gpufrac-mps DaemonSet's containers run);
the agent runs with `--mps-daemons external --csi` and finds them through its /proc. The test plays the kubelet: it
reads the agent's registration socket and calls NodePublishVolume on its CSI socket for pods created through the
real admission path, and checks the real bind mounts. GPU and MPS are the fakes (testkit/fakes).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from e2e.agent_world import GPU_UUIDS, AgentWorld, metric_value
from e2e.testing import unique
from e2e.toolkit.wait import wait_until
from gpufrac.agent.csi import mounts
from gpufrac.agent.csi.stubs import csi_pb2, csi_pb2_grpc
from gpufrac.agent.kubelet_plugin.stubs import pluginregistration_pb2, pluginregistration_pb2_grpc
from testkit.pods import IMAGE

pytestmark = pytest.mark.e2e

DRIVER = "mps.gpufrac.io"
KAI = "gpu-sharing.nvidia.com/Ready"
MODES = ("time-slicing", "sm-sharing")


@pytest.fixture(scope="module")
def kubelet_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gfk-", dir="/tmp"))  # unix socket paths stay under 108 bytes
    yield path
    for target in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if target.is_dir() and mounts.is_mount_point(target):
            mounts.unmount(target)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def world(cluster, tmp_path_factory, kubelet_dir) -> Iterator[AgentWorld]:
    w = AgentWorld(cluster, tmp_path_factory.mktemp("mps-node"))
    for mode in MODES:
        w.start_mps(mode, "--restart-backoff", "2")
    wait_until(lambda: all(w.live_daemons(m) for m in MODES), 30, "the MPS daemons of both modes")
    w.expose_daemons()
    start_agent(w, kubelet_dir)
    yield w
    try:
        w.stop_agent()
        for mode in list(w.mps):
            w.stop_mps(mode)
    finally:
        w.delete_pods(*w.created)


@pytest.fixture(autouse=True)
def _pods_in_the_tests_namespace(world, ns):
    """The module's node and agent serve every test; the pods each test makes are in its own namespace."""
    world.namespace = ns


def start_agent(w: AgentWorld, kubelet_dir: Path) -> None:
    w.start_agent("--mps-daemons", "external", "--csi", "--kubelet-dir", str(kubelet_dir))
    wait_until(lambda: ready(w), 30, "both Ready conditions True")


def ready(w: AgentWorld) -> bool:
    w.expose_daemons()
    conditions = [w.node_condition(), w.node_condition(KAI)]
    return all(c is not None and c["status"] == "True" for c in conditions)


def quits(w: AgentWorld, mode: str) -> list[dict[str, Any]]:
    return [r for r in w.daemon_records(mode) if r["event"] == "command" and r["command"] == "quit"]


def publish_context(pod: dict[str, Any], mode: str) -> dict[str, str]:
    """The volume context the kubelet sends for the pod's inline volume (CSIDriver podInfoOnMount: true)."""
    (volume,) = [v for v in pod["spec"]["volumes"] if "csi" in v]
    assert volume["csi"] == {"driver": DRIVER, "volumeAttributes": {"mode": mode}}
    meta = pod["metadata"]
    return {**volume["csi"]["volumeAttributes"], "csi.storage.k8s.io/pod.name": meta["name"],
            "csi.storage.k8s.io/pod.namespace": meta["namespace"], "csi.storage.k8s.io/pod.uid": meta["uid"],
            "csi.storage.k8s.io/serviceAccount.name": "default", "csi.storage.k8s.io/ephemeral": "true"}


def node_stub(kubelet_dir: Path) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(f"unix://{kubelet_dir}/plugins/{DRIVER}/csi.sock")
    return channel, csi_pb2_grpc.NodeStub(channel)


def publish(kubelet_dir: Path, target: Path, context: dict[str, str]) -> None:
    capability = csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume(), access_mode=csi_pb2
                                          .VolumeCapability.AccessMode(mode=csi_pb2.VolumeCapability.AccessMode
                                                                       .SINGLE_NODE_WRITER))
    channel, node = node_stub(kubelet_dir)
    with channel:
        node.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(
            volume_id=f"csi-{context['csi.storage.k8s.io/pod.uid'][:8]}", target_path=str(target),
            volume_capability=capability, volume_context=context), timeout=15)


def unpublish(kubelet_dir: Path, target: Path) -> None:
    channel, node = node_stub(kubelet_dir)
    with channel:
        node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(volume_id="csi-x", target_path=str(target)),
                                 timeout=15)


def test_the_registration_socket_names_the_driver_and_its_socket(world, kubelet_dir):
    with grpc.insecure_channel(f"unix://{kubelet_dir}/plugins_registry/{DRIVER}-reg.sock") as channel:
        info = pluginregistration_pb2_grpc.RegistrationStub(channel).GetInfo(pluginregistration_pb2.InfoRequest(),
                                                                             timeout=10)
    assert (info.type, info.name) == ("CSIPlugin", DRIVER)
    assert info.endpoint == f"{kubelet_dir}/plugins/{DRIVER}/csi.sock"


def test_a_fractional_pod_gets_its_modes_pipe_directory_from_the_driver(world, kubelet_dir):
    fp = world.create_pod(unique("csi-sm"), gpu_uuid=GPU_UUIDS[0], limit_mib=8000, mode="sm-sharing")
    pod = world.get_pod(fp.name)
    target = kubelet_dir / "pods" / fp.uid / "volumes/kubernetes.io~csi/gpufrac-mps-sm-sharing/mount"
    publish(kubelet_dir, target, publish_context(pod, "sm-sharing"))
    assert (target / "pipe" / "control").is_socket(), "the fake MPS daemon's control socket, seen through the mount"
    assert mounts.is_mount_point(target / "pipe") and mounts.is_mount_point(target / "shm")
    assert "Starting control daemon" in (world.log_root / "sm-sharing" / "control.log").read_text()
    unpublish(kubelet_dir, target)
    assert not target.exists()
    assert (world.mps_root / "sm-sharing" / "control").is_socket(), "unpublish leaves the daemon's socket"


def test_a_pod_that_is_not_fractional_is_refused_by_the_driver(world, kubelet_dir, ns):
    name = unique("csi-plain")
    volume = {"name": "mps", "csi": {"driver": DRIVER, "volumeAttributes": {"mode": "sm-sharing"}}}
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
                "spec": {"containers": [{"name": "app", "image": IMAGE, "volumeMounts": [
                    {"name": "mps", "mountPath": "/mps"}]}], "volumes": [volume]}}
    rc, _, err = world.cp.kubectl("create", "-f", "-", user="alice", input=json.dumps(manifest))
    assert rc == 0, err  # no fraction keys: the webhook never sees it; the driver is the guard
    world.created.append(name)  # in the test's namespace, where the world is now
    pod = world.get_pod(name)
    target = kubelet_dir / "pods" / pod["metadata"]["uid"] / "volumes/kubernetes.io~csi/mps/mount"
    with pytest.raises(grpc.RpcError) as caught:
        publish(kubelet_dir, target, publish_context(pod, "sm-sharing"))
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert f"pod {ns}/{name} is not a GPU-fraction pod" in caught.value.details()
    assert not (target / "pipe").exists()


def test_killing_the_agent_leaves_the_daemons_running_and_it_adopts_them_again(world, kubelet_dir):
    before = {mode: world.live_daemons(mode) for mode in MODES}
    assert all(len(pids) == 1 for pids in before.values()), before
    world.kill_agent()
    assert {mode: world.live_daemons(mode) for mode in MODES} == before, "SIGKILL of the agent left them alone"
    start_agent(world, kubelet_dir)
    assert {mode: world.live_daemons(mode) for mode in MODES} == before, "the agent found them, started none"
    for mode in MODES:
        assert quits(world, mode) == [], f"the {mode} daemon never got quit"
        assert metric_value(world.metrics(), "gpufrac_mps_daemon_up", mode=mode) == 1


def test_stopping_the_agent_as_a_rollout_does_leaves_the_daemons_running(world, kubelet_dir):
    before = {mode: world.live_daemons(mode) for mode in MODES}
    assert world.stop_agent() == 0
    assert world.node_condition(KAI)["status"] == "Unknown", "no agent: KAI places no fractions here"
    assert not (kubelet_dir / "plugins_registry" / f"{DRIVER}-reg.sock").exists(), "the driver deregisters"
    assert {mode: world.live_daemons(mode) for mode in MODES} == before
    start_agent(world, kubelet_dir)
    assert {mode: world.live_daemons(mode) for mode in MODES} == before
    assert all(quits(world, mode) == [] for mode in MODES)


def restart_events(world: AgentWorld) -> dict[str, dict[str, Any]]:
    out = world.cp.kubectl("get", "events", "-n", "default", "-o", "json", "--field-selector",
                           "reason=MpsDaemonRestarted", user="admin").stdout
    return {e["metadata"]["name"]: e for e in json.loads(out)["items"]}


def test_a_crashed_daemon_is_restarted_with_backoff_and_the_kai_condition_says_so(world, kubelet_dir):
    (old,) = world.live_daemons("sm-sharing")
    earlier = restart_events(world)  # other tests of the session restart daemons on this node too
    flag = world.log_root / "sm-sharing" / "fake-crash"
    flag.write_text("")

    def restarting() -> dict[str, Any] | None:
        condition = world.node_condition(KAI)
        return condition if condition and condition["reason"] == "MpsDaemonRestarting" else None

    condition = wait_until(restarting, 20, "the KAI condition to say the daemon is restarting")
    assert condition["status"] == "False"
    assert "the sm-sharing MPS control daemon exited with code 1 and is being restarted with backoff" in \
        condition["message"]
    flag.unlink()
    new = wait_until(lambda: [p for p in world.live_daemons("sm-sharing") if p != old], 30, "a new daemon")
    assert len(new) == 1
    wait_until(lambda: ready(world), 30, "both conditions True again")
    assert metric_value(world.metrics(), "gpufrac_mps_daemon_restarts_total", mode="sm-sharing") == 1
    events = [e for name, e in restart_events(world).items() if name not in earlier]
    assert [e["involvedObject"]["name"] for e in events] == [world.node]
    assert "sm-sharing MPS control daemon exited with code 1 and was restarted" in events[0]["message"]


def test_stopping_the_mps_container_quits_its_daemon(world):
    assert world.stop_mps("time-slicing") == 0
    assert len(quits(world, "time-slicing")) == 1, "uninstall or drain: the daemon gets quit"
    # Until the quit daemon's process is gone its pipe directory still names it ("not up yet (starting)"):
    # what must come is the condition that sends a person to the DaemonSet.
    condition = wait_until(
        lambda: (c := world.node_condition()) and c["status"] == "False"
        and "check the gpufrac-mps DaemonSet pod on this node" in c["message"] and c, 20,
        "the node to say time-slicing lost its daemon and where to look")
    assert condition["reason"] == "MpsDaemonNotReady"
