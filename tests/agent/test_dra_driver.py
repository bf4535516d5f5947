"""The DRA driver against a real kube-apiserver 1.36 (resource.k8s.io/v1) and a real gRPC client on its unix
sockets, as the kubelet drives it: the ResourceSlices it publishes are accepted and kept in step, Prepare reads the
claim's allocation from the API and answers with CDI devices and a spec file, a restarted driver finds its prepared
claims, Unprepare undoes it, and the mode backstop refuses one claim without failing the call's others.

The GPUs are the one thing made up (an Inventory); no kubelet or scheduler runs: the test writes the allocation
into the claim's status, as the scheduler does."""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from e2e.cluster import ControlPlane
from e2e.state import private_workdir
from e2e.toolkit.errors import ClusterError, ToolsMissingError
from e2e.toolkit.tools import Tools
from e2e.toolkit.wait import wait_until
from gpufrac.agent.decide.errors import ConfigError
from gpufrac.agent.decide.model import GpuInfo, Inventory
from gpufrac.agent.dra.decide.claims import ClaimRef, read_claim
from gpufrac.agent.dra.decide.prepare import DraNode
from gpufrac.agent.dra.driver import DraDriver, dra_node
from gpufrac.agent.dra.files import ClaimSpecs, StateFile
from gpufrac.agent.dra.kube import DraKube
from gpufrac.agent.dra.plugin import DraPlugin, plugin_paths
from gpufrac.agent.dra.service import DraService, dra_door
from gpufrac.agent.dra.stubs import dra_pb2, dra_pb2_grpc
from gpufrac.agent.kubelet_plugin.stubs import pluginregistration_pb2, pluginregistration_pb2_grpc
from gpufrac.agent.programs import node_agent
from gpufrac.core.contract import FRONT_DOOR_LABEL, FrontDoor
from gpufrac.kube.client import load_api_client
from testkit.agent import FakeNode
from testkit.chart import HELM, render
from testkit.pods import EXAMPLES as ALL_EXAMPLES

GIB = 1 << 30
UUID_C = "GPU-cccccccc-0000-0000-0000-000000000003"
NODE = "dra-node"
INVENTORY = Inventory("615.10", 13040, tuple(GpuInfo(i, f"GPU-{i}1111111-bbbb", "NVIDIA H100 80GB HBM3", 80 * GIB)
                                            for i in range(2)))
EXAMPLES = ALL_EXAMPLES / "dra"
USABLE = {"gpufrac.io/gpu-memory-usable-mib.NVIDIA-H100-80GB-HBM3": "81000"}


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    try:
        tools = Tools.find()
    except ToolsMissingError as exc:
        pytest.skip(f"no kube-apiserver to test against (make tools): {exc}")
    cp = ControlPlane(private_workdir("dra-driver"), tools=tools, register_webhook=False, policies=False)
    try:
        cp.start()
    except ClusterError as exc:
        pytest.fail(f"the control plane did not start: {exc}", pytrace=False)
    yield cp
    cp.stop(remove_workdir=True)


@dataclass
class World:
    plane: ControlPlane
    api: DraKube
    node: DraNode
    specs: ClaimSpecs
    state: StateFile
    sockets: Path

    def driver(self, node: DraNode | None = None, hold: Callable[[], str | None] = lambda: None) -> DraDriver:
        return DraDriver(lambda: node or self.node, self.api, self.specs, self.state, lambda: "615.10", hold)

    def kubectl(self, *args: str, input: str | None = None) -> str:
        return self.plane.kubectl(*args, user="admin", input=input, check=True).stdout


@pytest.fixture
def world(plane: ControlPlane, tmp_path: Path) -> Iterator[World]:
    node = dra_node(NODE, INVENTORY, USABLE, "/run/gpufrac/mps", ["time-slicing", "sm-sharing"],
                    frozenset({"nvidia.com/gpu=GPU-01111111-bbbb"}), dev=tmp_path)
    assert node is not None
    # Short: a unix socket path has at most 107 bytes, and pytest's tmp_path can be long.
    sockets = Path(f"/tmp/dra-{uuid.uuid4().hex[:8]}")
    yield World(plane, DraKube(load_api_client(str(plane.kubeconfigs["admin"]))), node,
                ClaimSpecs(tmp_path / "cdi"), StateFile(tmp_path / "state" / "prepared.json"), sockets)
    plane.kubectl("delete", "resourceslices", "--all", user="admin")
    plane.kubectl("delete", "resourceclaims", "--all", "-n", "default", user="admin")
    for socket in sockets.glob("**/*.sock"):
        socket.unlink()


def slices(world: World) -> dict[str, dict[str, Any]]:
    items = json.loads(world.kubectl("get", "resourceslices", "-o", "json"))["items"]
    return {item["metadata"]["name"]: item for item in items}


def allocated_claim(world: World, name: str, device: str, memory: str, limit: str | None = None,
                    pool: str = NODE) -> str:
    """A claim as the scheduler leaves it: created, then its status.allocation written. Its UID."""
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "namespace": "default"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": "time-slicing.gpu.gpufrac.io",
                 "capacity": {"requests": {"memory": memory}}}}]}}}
    world.kubectl("create", "-f", "-", input=json.dumps(claim))
    uid = json.loads(world.kubectl("get", "resourceclaim", name, "-n", "default", "-o", "json"))["metadata"]["uid"]
    config = [] if limit is None else [{"source": "FromClaim", "requests": ["gpu"], "opaque": {
        "driver": "gpu.gpufrac.io",
        "parameters": {"apiVersion": "gpu.gpufrac.io/v1alpha1", "kind": "GpuConfig", "memoryLimit": limit}}}]
    status = {"status": {"allocation": {"devices": {"results": [{
        "request": "gpu", "driver": "gpu.gpufrac.io", "pool": pool, "device": device,
        "shareID": str(uuid.uuid4()), "consumedCapacity": {"memory": memory}}], "config": config},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [pool]}]}]}}}}
    world.kubectl("patch", "resourceclaim", name, "-n", "default", "--subresource=status", "--type=merge",
                  "-p", json.dumps(status))
    return str(uid)


def dial(socket: Path) -> grpc.Channel:
    return grpc.insecure_channel(f"unix://{socket}")


def test_the_slices_are_accepted_and_republished_only_when_the_gpus_change(world: World) -> None:
    driver = world.driver()
    assert driver.publish() is True
    published = slices(world)
    assert sorted(published) == [f"{NODE}-gpufrac-counters", f"{NODE}-gpufrac-devices"]
    devices = published[f"{NODE}-gpufrac-devices"]["spec"]["devices"]
    assert [d["name"] for d in devices] == ["gpu-0-time-slicing", "gpu-0-sm-sharing", "gpu-0",
                                            "gpu-1-time-slicing", "gpu-1-sm-sharing", "gpu-1"]
    assert {d["capacity"]["memory"]["value"] for d in devices} == {"81000Mi"}
    assert driver.publish() is False  # nothing changed: nothing written
    assert all("ownerReferences" not in s["metadata"] for s in published.values())  # no Node of that name yet
    world.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": NODE}}))
    node_uid = json.loads(world.kubectl("get", "node", NODE, "-o", "json"))["metadata"]["uid"]
    assert driver.publish() is True  # the owner, once the Node is there
    assert [s["metadata"]["ownerReferences"] for s in slices(world).values()] == 2 * [
        [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid, "controller": True}]]
    world.kubectl("delete", "node", NODE)
    owned = {s["spec"]["pool"]["generation"] for s in slices(world).values()}

    smaller = dra_node(NODE, INVENTORY, {k: "80000" for k in USABLE}, "/run/gpufrac/mps", [], frozenset())
    restarted = world.driver(smaller)  # a new process: it does not know what the last one published
    assert restarted.publish() is True
    again = slices(world)
    assert {s["spec"]["pool"]["generation"] for s in again.values()} == {max(owned) + 1}
    assert {d["capacity"]["memory"]["value"] for d in again[f"{NODE}-gpufrac-devices"]["spec"]["devices"]} == {
        "80000Mi"}


def test_prepare_over_grpc_writes_the_spec_and_a_restarted_driver_unprepares_it(world: World) -> None:
    uid = allocated_claim(world, "half", "gpu-0-time-slicing", "40Gi", limit="48Gi")
    endpoint, registration = plugin_paths(world.sockets, "gpu.gpufrac.io")
    plugin = DraPlugin("gpu.gpufrac.io", endpoint, registration, world.driver())
    plugin.start()
    try:
        with dial(registration) as channel:
            info = pluginregistration_pb2_grpc.RegistrationStub(channel).GetInfo(pluginregistration_pb2.InfoRequest())
        assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == (
            "DRAPlugin", "gpu.gpufrac.io", str(endpoint), ["v1.DRAPlugin"])
        with dial(endpoint) as channel:
            stub = dra_pb2_grpc.DRAPluginStub(channel)
            claims = [dra_pb2.Claim(namespace="default", name="half", uid=uid)]
            answer = stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=claims)).claims[uid]
    finally:
        plugin.stop()
    assert answer.error == ""
    [device] = answer.devices
    assert (list(device.request_names), device.pool_name, device.device_name) == (["gpu"], NODE, "gpu-0-time-slicing")
    assert list(device.cdi_device_ids) == ["nvidia.com/gpu=GPU-01111111-bbbb",
                                           f"gpu.gpufrac.io/claim={uid}-gpu-0-time-slicing"]
    spec = json.loads(world.specs.path(uid).read_text())
    env = spec["devices"][0]["containerEdits"]["env"]
    assert "NVIDIA_GPU_MEMORY_REQUEST=40960" in env and "NVIDIA_GPU_MEMORY_LIMIT=49152" in env

    world.kubectl("delete", "resourceclaim", "half", "-n", "default")  # a restart needs no API to answer again
    restarted = world.driver()
    assert [d.cdi_ids for d in restarted.prepared[uid].devices] == [tuple(device.cdi_device_ids)]
    world.specs.remove(uid)  # /var/run was cleared (a reboot): a repeated Prepare writes the spec again
    ref = ClaimRef("default", "half", uid)
    assert restarted.prepare(ref) == restarted.prepare(ref) and world.specs.exists(uid)
    assert restarted.unprepare(ref) is None and restarted.unprepare(ref) is None
    assert not world.specs.exists(uid) and world.driver().prepared == {}


def test_one_refused_claim_does_not_fail_the_others_of_the_call(world: World) -> None:
    first = allocated_claim(world, "ts", "gpu-0-time-slicing", "10Gi")
    second = allocated_claim(world, "sm", "gpu-0-sm-sharing", "10Gi")  # the allocator bug the backstop is for
    third = allocated_claim(world, "other-gpu", "gpu-1-sm-sharing", "10Gi")
    endpoint, _ = plugin_paths(world.sockets, "gpu.gpufrac.io")
    plugin = DraPlugin("gpu.gpufrac.io", endpoint, None, world.driver())
    plugin.start()
    try:
        with dial(endpoint) as channel:
            claims = [dra_pb2.Claim(namespace="default", name=n, uid=u)
                      for n, u in (("ts", first), ("sm", second), ("other-gpu", third), ("gone", "uid-gone"))]
            answers = dra_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra_pb2.NodePrepareResourcesRequest(claims=claims)).claims
    finally:
        plugin.stop()
    assert answers[first].error == "" and answers[third].error == ""
    assert answers[second].error.startswith("GPU 0 (GPU-01111111-bbbb) serves time-slicing to claim default/ts")
    assert answers["uid-gone"].error == "claim default/gone (uid-gone) is gone from the API server"
    assert sorted(world.driver().prepared) == sorted([first, third])


def test_an_sm_sharing_claim_is_prepared_only_once_the_daemon_holds_its_limits(world: World) -> None:
    """After recording an sm-sharing share, Prepare has the agent tell the MPS daemon (Agent.hold_now) before it
    answers: the share's process never connects to a daemon that does not hold it. Where that fails, Prepare fails
    (the kubelet retries; the record stays, so the retry only asks again). A time-slicing share needs no daemon."""
    sm_uid = allocated_claim(world, "sm", "gpu-1-sm-sharing", "10Gi")
    ts_uid = allocated_claim(world, "ts", "gpu-0-time-slicing", "10Gi")
    asked: list[str] = []
    answer: list[str | None] = ["'get_server_list' to the MPS daemon in /run/gpufrac/mps/sm-sharing: exit 1"]
    driver = world.driver(hold=lambda: asked.append("hold") or answer[0])
    refused = driver.prepare(ClaimRef("default", "sm", sm_uid))
    assert isinstance(refused, str) and refused.startswith(
        f"claim default/sm ({sm_uid}) is prepared, but the sm-sharing MPS daemon did not take its limits ('get_")
    assert asked == ["hold"] and sm_uid in driver.prepared
    assert not isinstance(driver.prepare(ClaimRef("default", "ts", ts_uid)), str) and asked == ["hold"]
    answer[0] = None
    devices = driver.prepare(ClaimRef("default", "sm", sm_uid))
    assert not isinstance(devices, str) and [d.device for d in devices] == ["gpu-1-sm-sharing"]
    assert asked == ["hold", "hold"]


def test_a_state_file_that_does_not_read_stops_the_start_with_one_line(world: World) -> None:
    world.state.write("{not json")
    with pytest.raises(ConfigError, match=r"prepared\.json: the prepared claims do not read"):
        world.driver()


@pytest.mark.skipif(not HELM.exists(), reason="helm not built (make tools)")
def test_the_charts_device_classes_are_accepted_by_the_api_server(world: World) -> None:
    classes = [o for o in render("--set", "dra.enabled=true") if o["kind"] == "DeviceClass"]
    created = world.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                    "items": classes}))
    try:
        assert sorted(created.split()) == sorted(
            ["deviceclass.resource.k8s.io/gpu.gpufrac.io", "deviceclass.resource.k8s.io/sm-sharing.gpu.gpufrac.io",
             "deviceclass.resource.k8s.io/time-slicing.gpu.gpufrac.io", "created", "created", "created"])
    finally:
        world.kubectl("delete", "deviceclasses", "--all")


@pytest.mark.skipif(not HELM.exists(), reason="helm not built (make tools)")
def test_a_claim_whose_opaque_config_the_driver_would_refuse_is_denied_at_admission(world: World) -> None:
    """The chart's policy on claims, claim templates and classes, in force on this API server (no webhook)."""
    objs = render("--set", "dra.enabled=true")
    policy = [o for o in objs if o["kind"].startswith("ValidatingAdmissionPolicy")
              and o["metadata"]["name"].endswith("-dra-config")]
    assert sorted(o["kind"] for o in policy) == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    world.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": policy}))

    def claim(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": "time-slicing.gpu.gpufrac.io"}}], "config": [{"opaque": {
                        "driver": "gpu.gpufrac.io", "parameters": parameters}}]}}}

    good = {"apiVersion": "gpu.gpufrac.io/v1alpha1", "kind": "GpuConfig", "memoryLimit": "48Gi"}
    try:
        def denied(parameters: dict[str, Any]) -> str:
            done = world.plane.kubectl("create", "--dry-run=server", "-f", "-", user="admin",
                                       input=json.dumps(claim("c", parameters)))
            return done.stderr if done.rc else ""

        # the policy takes a moment to be in force: a bad config is denied once it is
        wait_until(lambda: denied({**good, "kind": "Other"}), timeout=30, what="the claim policy in force",
                   interval=0.5)
        assert "must be apiVersion gpu.gpufrac.io/v1alpha1, kind GpuConfig" in denied({**good, "kind": "Other"})
        assert "has unknown fields; it takes memoryLimit" in denied({**good, "cores": 30})
        assert "needs memoryLimit, a quantity" in denied({**good, "memoryLimit": "lots"})
        assert denied(good) == ""
        other_driver = claim("d", {"anything": True})
        other_driver["spec"]["devices"]["config"][0]["opaque"]["driver"] = "gpu.example.com"
        assert world.plane.kubectl("create", "--dry-run=server", "-f", "-", user="admin",
                                   input=json.dumps(other_driver)).rc == 0
    finally:
        world.kubectl("delete", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": policy}))


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_the_examples_are_valid_objects_of_this_api_server(world: World, example: str) -> None:
    created = world.kubectl("create", "--dry-run=server", "-n", "default", "-f", str(EXAMPLES / example))
    assert created.count("(server dry run)") == 2, created
    [template] = [d for d in yaml.safe_load_all((EXAMPLES / example).read_text()) if d["kind"] != "Deployment"]
    # Whatever opaque config an example gives reads as this driver reads it.
    configs = [{"source": "FromClaim", **c} for c in template["spec"]["spec"]["devices"].get("config", [])]
    allocation = read_claim({"metadata": {"namespace": "default", "name": "c", "uid": "u"},
                             "status": {"allocation": {"devices": {"config": configs, "results": [
                                 {"request": "gpu", "driver": "gpu.gpufrac.io", "pool": NODE, "device": "gpu-0"}]}}}})
    assert allocation.limit_mib == ({"gpu": 48 * 1024} if configs else {})


def test_each_registration_by_the_kubelet_makes_the_driver_write_its_slices_again(world: World) -> None:
    """The kubelet deletes a driver's slices when it restarts or loses the driver, then registers it again."""
    driver = world.driver()
    assert driver.publish() is True
    world.kubectl("delete", "resourceslices", "--all")
    endpoint, registration = plugin_paths(world.sockets, "gpu.gpufrac.io")
    plugin = DraPlugin("gpu.gpufrac.io", endpoint, registration, driver, on_registered=driver.republish)
    plugin.start()
    try:
        with dial(registration) as channel:
            pluginregistration_pb2_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(plugin_registered=True))
    finally:
        plugin.stop()
    assert plugin.registration.registered.is_set()
    assert driver.publish() is True
    assert sorted(slices(world)) == [f"{NODE}-gpufrac-counters", f"{NODE}-gpufrac-devices"]


@contextlib.contextmanager
def live_agent_with_dra(world: World, fake_node: FakeNode, tmp_path: Path, *flags: str) -> Iterator[tuple[Any, Any]]:
    """`gpufrac agent --dra` as node_agent.run wires it, over the fake node's running agent: (agent, DraService)."""
    parser = argparse.ArgumentParser()
    node_agent.add_arguments(parser)
    args = parser.parse_args(["--node", fake_node.config.node, "--dra", "--kubelet-dir", str(world.sockets),
                              "--dra-cdi-dir", str(tmp_path / "cdi"), "--dra-state-file", str(tmp_path / "s.json"),
                              "--cdi-spec-dir", str(tmp_path / "no-specs"),
                              "--dra-runtime-cdi-dir", str(tmp_path / "cdi"), *flags])
    door = dra_door(args, load_api_client(str(world.plane.kubeconfigs["admin"])))
    assert door is not None
    agent = fake_node.agent(doors=[door])
    [service] = agent.doors.all
    assert isinstance(service, DraService)
    stop = threading.Event()
    loop = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    loop.start()
    try:
        wait_until(lambda: agent.inventory is not None and all(s.up for s in agent.daemon_statuses().values())
                   and agent.audit.guarantee.labels, 20, "the agent's GPUs, daemons and usable memory", interval=0.05)
        service.start()
        try:
            yield agent, service
        finally:
            service.stop()
    finally:
        stop.set()
        loop.join(30)


def test_gpufrac_agent_dra_serves_the_live_agents_gpus_and_mps_daemons(world: World, fake_node: FakeNode,
                                                                        tmp_path: Path) -> None:
    """The node's facts come from the running agent (the fake NVML's GPUs, its usable-memory labels, its MPS
    daemons), the slices go to the API server, and an sm-sharing claim gets the MPS daemon's pipe directory."""
    node = fake_node.config.node  # the agent's: what its slices and pool are named after
    fake_node.gpus.gpu(UUID_C, memory_total_mib=80000)  # GPUs 0 and 1 hold the fake node's annotated fractions
    with live_agent_with_dra(world, fake_node, tmp_path) as (agent, service):
        wait_until(lambda: len(slices(world)) == 2, 20, "the agent's slices", interval=0.1)
        usable = {int(v) for v in agent.audit.guarantee.labels.values()}
        devices = slices(world)[f"{node}-gpufrac-devices"]["spec"]["devices"]
        assert {d["attributes"]["uuid"]["string"] for d in devices} == {g.uuid for g in agent.inventory.gpus}
        assert {d["capacity"]["memory"]["value"] for d in devices} == {f"{mib}Mi" for mib in usable}
        # one front door per GPU: GPU 1 holds the sm-sharing pod's annotated fraction
        busy = allocated_claim(world, "busy", "gpu-1-sm-sharing", "1Gi", pool=node)
        refused = service.driver.prepare(ClaimRef("default", "busy", busy))
        assert isinstance(refused, str) and "(container worker of pod team-a/infer is placed on it)" in refused
        uid = allocated_claim(world, "sm", "gpu-2-sm-sharing", "1Gi", pool=node)
        devices_answer = service.driver.prepare(ClaimRef("default", "sm", uid))
        assert not isinstance(devices_answer, str), devices_answer
        env = json.loads(ClaimSpecs(tmp_path / "cdi").path(uid).read_text())["devices"][0]["containerEdits"]["env"]
        assert f"CUDA_MPS_PIPE_DIRECTORY={fake_node.config.mps_root}/sm-sharing" in env
        # every GPU of a DRA node is one the NRI plugin refuses annotated fractions on
        assert agent.door_gpus()[UUID_C] == "its node's front door is DRA (the default front door (dra; node " \
            "label gpufrac.io/front-door unset))"


def test_a_node_labelled_for_annotations_publishes_no_devices_and_refuses_claims_until_labelled_dra(
        world: World, fake_node: FakeNode, tmp_path: Path) -> None:
    """The per-node choice, read from the live Node: relabelling it moves the door within one publishing."""
    node = fake_node.config.node
    fake_node.gpus.gpu(UUID_C, memory_total_mib=80000)
    world.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": node, "labels": {FRONT_DOOR_LABEL: "annotations"}}}))
    try:
        with live_agent_with_dra(world, fake_node, tmp_path) as (agent, service):
            assert service.front_door.choice.door is FrontDoor.ANNOTATIONS
            service.driver.publish()
            assert slices(world) == {}
            assert agent.door_gpus() == {}
            uid = allocated_claim(world, "ts", "gpu-2-time-slicing", "1Gi", pool=node)
            refused = service.driver.prepare(ClaimRef("default", "ts", uid))
            assert isinstance(refused, str) and refused.startswith(
                f"node {node} hands its GPUs out through annotations (node label gpufrac.io/front-door=annotations)")
            world.kubectl("label", "node", node, f"{FRONT_DOOR_LABEL}=dra", "--overwrite")
            wait_until(lambda: len(slices(world)) == 2, 30, "the slices once the node is labelled dra", interval=0.2)
            assert set(agent.door_gpus()) == {gpu.uuid for gpu in agent.inventory.gpus}
            assert not isinstance(service.driver.prepare(ClaimRef("default", "ts", uid)), str)
            # a value that is neither door: the default is followed, and the node's condition says so
            world.kubectl("label", "node", node, f"{FRONT_DOOR_LABEL}=dar", "--overwrite")
            said = (f"node label {FRONT_DOOR_LABEL}='dar' is neither annotations nor dra: the default dra is used")
            wait_until(lambda: said in fake_node.kube.last_condition().get("message", ""), 30,
                       "the label's problem on the node's condition", interval=0.2)
            assert fake_node.kube.last_condition()["status"] == "True"
    finally:
        world.kubectl("delete", "node", node, "--ignore-not-found")


def test_after_a_reboot_a_recorded_claim_is_answered_only_with_its_spec_written(world: World) -> None:
    uid = allocated_claim(world, "booted", "gpu-0-time-slicing", "10Gi")
    ref = ClaimRef("default", "booted", uid)
    assert not isinstance(world.driver().prepare(ref), str)
    world.specs.remove(uid)  # the reboot cleared /var/run/cdi; the kubelet prepares the claim again
    nvml: list[DraNode | None] = [None]
    restarted = DraDriver(lambda: nvml[0], world.api, world.specs, world.state, lambda: "615.10")
    waiting = restarted.prepare(ref)
    assert isinstance(waiting, str) and "its CDI spec is gone (a reboot); the agent writes it again once it has " \
        "read this node's GPUs" in waiting and not world.specs.exists(uid)
    nvml[0] = world.node
    answer = restarted.prepare(ref)
    assert not isinstance(answer, str) and world.specs.exists(uid)
    # a container the kubelet restarts needs the spec too, without a Prepare: each pass writes a missing one again
    world.specs.remove(uid)
    restarted.reconcile()
    assert world.specs.exists(uid)


def test_each_pass_drops_the_records_of_claims_gone_and_takes_every_pod_a_claim_is_reserved_for(world: World) -> None:
    shared = allocated_claim(world, "shared", "gpu-0-time-slicing", "10Gi")
    ghost = allocated_claim(world, "ghost", "gpu-1-time-slicing", "10Gi")
    driver = world.driver()
    for name, uid in (("shared", shared), ("ghost", ghost)):
        assert not isinstance(driver.prepare(ClaimRef("default", name, uid)), str)
    pods = [{"resource": "pods", "name": f"infer-{i}", "uid": f"pod-uid-{i}"} for i in range(2)]
    world.kubectl("patch", "resourceclaim", "shared", "-n", "default", "--subresource=status", "--type=merge",
                  "-p", json.dumps({"status": {"reservedFor": pods}}))
    world.kubectl("delete", "resourceclaim", "ghost", "-n", "default")
    driver.reconcile()
    assert sorted(driver.prepared) == [shared] and not world.specs.exists(ghost)
    assert {p.uid for p in driver.prepared[shared].pods} == {"pod-uid-0", "pod-uid-1"}
    assert sorted(world.driver().prepared) == [shared]  # saved: a restart does not bring the ghost back
