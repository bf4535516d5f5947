"""Issue 32 on the real node: the DRA driver gpu.gpufrac.io registered with the real kubelet 1.36.3, its
ResourceSlices read by the real kube-scheduler, claims prepared for the kubelet and their CDI specs applied by the
real containerd. The driver runs in this test's process (the chart's agent DaemonSet does not carry the DRA flags
yet, docs/dra.md); the GPUs are the node's fake H200s (their device nodes and the toolkit's CDI spec are real).
No gpufrac release is needed: the pods carry no annotation."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from e2e.names import NODE_NAME, USER_NAMESPACE
from e2e.node import APP_IMAGE, GPU_UUIDS, RealCluster
from e2e.pods import exec_in, get_json, get_pod, host_pids, wait_running
from e2e.testing import unique
from e2e.toolkit.wait import wait_until
from gpufrac.agent.decide.attribution import attribute
from gpufrac.agent.decide.claim_tenants import claim_tenants
from gpufrac.agent.decide.dra_prepare import DraNode
from gpufrac.agent.decide.dra_slices import DRIVER
from gpufrac.agent.decide.model import GpuInfo, GpuProcess, Inventory
from gpufrac.agent.edges.dra.files import ClaimSpecs, StateFile
from gpufrac.agent.edges.dra.kube import DraKube
from gpufrac.agent.edges.dra.server import DraPlugin, plugin_paths
from gpufrac.agent.edges.nri.devices import CdiSpecs
from gpufrac.agent.programs.dra_driver import DraDriver, dra_node
from gpufrac.kube.client import load_api_client
from testkit.chart import render

pytestmark = [pytest.mark.e2e, pytest.mark.real_node]

MIB = 1 << 20
LIST = "ls /dev | grep -E '^nvidia[0-9]+$'; echo LIMIT=$NVIDIA_GPU_MEMORY_LIMIT REQUEST=$NVIDIA_GPU_MEMORY_REQUEST"


@dataclass
class Dra:
    node: RealCluster
    driver: DraDriver
    plugin: DraPlugin
    inventory: Inventory
    facts: Callable[[], DraNode | None]
    api: DraKube
    state: StateFile

    def restarted_driver(self) -> DraDriver:
        """A new driver process: what it knows comes from the state file."""
        return DraDriver(self.facts, self.api, ClaimSpecs(self.node.cdi_dir), self.state)

    def kubectl(self, *args: str, input: str | None = None) -> str:
        return self.node.kubectl(*args, user="admin", input=input, check=True).stdout


def inventory(node: RealCluster) -> Inventory:
    state = node.gpu_state().state
    return Inventory(state["driver_version"], state["cuda_driver_version"], tuple(
        GpuInfo(i, g["uuid"], g["name"], g["memory_total_mib"] * MIB) for i, g in enumerate(state["gpus"])))


@pytest.fixture(scope="module")
def dra(node: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dra]:
    gpus = inventory(node)
    cdi = CdiSpecs([node.cdi_dir])

    def facts() -> DraNode | None:
        return dra_node(NODE_NAME, gpus, {}, "/run/gpufrac/mps", [], cdi.names())

    api = DraKube(load_api_client(str(node.kubeconfigs["admin"])))
    state = StateFile(tmp_path_factory.mktemp("dra") / "prepared.json")
    driver = DraDriver(facts, api, ClaimSpecs(node.cdi_dir), state, lambda: gpus.driver_version)
    endpoint, registration = plugin_paths(node.node_root / "kubelet", DRIVER)
    plugin = DraPlugin(DRIVER, endpoint, registration, driver)
    plugin.start()
    classes = [o for o in render("--set", "dra.enabled=true") if o["kind"] == "DeviceClass"]
    node.kubectl("apply", "-f", "-", user="admin", check=True,
                 input=json.dumps({"apiVersion": "v1", "kind": "List", "items": classes}))
    try:
        assert plugin.registration.registered.wait(60), f"the kubelet did not register: {plugin.registration.error}"
        driver.publish()
        yield Dra(node, driver, plugin, gpus, facts, api, state)
    finally:
        plugin.stop()
        node.kubectl("delete", "deviceclasses", *[c["metadata"]["name"] for c in classes], user="admin")
        node.kubectl("delete", "resourceslices", "--field-selector", f"spec.driver={DRIVER}", user="admin")


def claim_and_pod(dra: Dra, name: str, device_class: str, memory: str) -> None:
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "namespace": USER_NAMESPACE},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": device_class, "capacity": {"requests": {"memory": memory}}}}]}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": USER_NAMESPACE},
           "spec": {"terminationGracePeriodSeconds": 1,
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                    "containers": [{"name": "app", "image": APP_IMAGE, "command": ["sleep", "infinity"],
                                    "resources": {"claims": [{"name": "gpu"}]}}]}}
    dra.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [claim, pod]}))


def delete(dra: Dra, *names: str) -> None:
    for name in names:
        dra.node.kubectl("delete", "pod", name, "-n", USER_NAMESPACE, "--wait=true", "--timeout=60s", user="admin")
        dra.node.kubectl("delete", "resourceclaim", name, "-n", USER_NAMESPACE, "--wait=true", "--timeout=60s",
                         user="admin")


def allocated_device(dra: Dra, name: str) -> str | None:
    status = get_json(dra.node, "get", "resourceclaim", name, "-n", USER_NAMESPACE).get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    return results[0]["device"] if results else None


def test_the_slices_list_the_nodes_gpus_with_their_memory(dra: Dra) -> None:
    found = json.loads(dra.kubectl("get", "resourceslices", "--field-selector", f"spec.driver={DRIVER}",
                                   "-o", "json"))["items"]
    devices = [d for s in found for d in s["spec"].get("devices", [])]
    assert len(found) == 2 and {s["spec"]["nodeName"] for s in found} == {NODE_NAME}
    by_uuid = {d["attributes"]["uuid"]["string"] for d in devices}
    assert by_uuid == set(GPU_UUIDS) and len(devices) == 3 * len(GPU_UUIDS)
    assert {d["capacity"]["memory"]["value"] for d in devices} == {
        f"{gpu.memory_total_bytes // MIB}Mi" for gpu in dra.inventory.gpus}


def test_two_40gi_claims_share_one_gpu_and_a_claim_that_fits_nowhere_stays_pending(dra: Dra) -> None:
    first, second, too_big = unique("dra-a"), unique("dra-b"), unique("dra-big")
    for name in (first, second):
        claim_and_pod(dra, name, "time-slicing.gpu.gpufrac.io", "40Gi")
    claim_and_pod(dra, too_big, "time-slicing.gpu.gpufrac.io", "200Gi")
    try:
        seen = {}
        for name in (first, second):
            wait_running(dra.node, name, timeout=180)
            seen[name] = exec_in(dra.node, name, LIST).split()
        assert allocated_device(dra, first) == allocated_device(dra, second) == "gpu-0-time-slicing"
        # Each container sees exactly its GPU's device node, and its claim's limit in MiB.
        assert seen[first] == seen[second] == ["nvidia0", "LIMIT=40960", "REQUEST=40960"]
        spec = json.loads(ClaimSpecs(dra.node.cdi_dir).path(
            get_json(dra.node, "get", "resourceclaim", first, "-n", USER_NAMESPACE)["metadata"]["uid"]).read_text())
        assert spec["kind"] == "gpu.gpufrac.io/claim"
        # The agent's audit and reclaim find each claim's processes by the pod UID in the kubelet's cgroup names.
        tenants = claim_tenants(dra.driver.claims())
        for name in (first, second):
            pid = host_pids(dra.node, name)[0]
            cgroups = {pid: Path(f"/proc/{pid}/cgroup").read_text()}
            [found] = attribute([GpuProcess(GPU_UUIDS[0], pid, MIB, 0)], {}, cgroups, {}, tenants)
            assert (found.container.pod, found.container.pod_uid, found.container.claim) == (
                name, get_pod(dra.node, name)["metadata"]["uid"], f"{name}/gpu")
            assert attribute([GpuProcess(GPU_UUIDS[1], pid, MIB, 0)], {}, cgroups, {}, tenants) == []

        def unschedulable() -> str | None:
            conditions = get_pod(dra.node, too_big)["status"].get("conditions") or []
            said = [c.get("message", "") for c in conditions if c["type"] == "PodScheduled" and c["status"] == "False"]
            return said[0] if said else None

        message = wait_until(unschedulable, 60, f"pod {too_big} unschedulable", interval=1)
        assert message is not None and re.search(r"cannot allocate all claims", message), message
        assert get_pod(dra.node, too_big)["status"]["phase"] == "Pending" and allocated_device(dra, too_big) is None
    finally:
        delete(dra, first, second, too_big)
    assert dra.driver.prepared == {}  # the kubelet unprepared both claims


def test_a_gpu_holding_time_slicing_shares_gets_no_sm_sharing_claim(dra: Dra) -> None:
    holder, other = unique("dra-ts"), unique("dra-sm")
    claim_and_pod(dra, holder, "time-slicing.gpu.gpufrac.io", "10Gi")
    try:
        wait_running(dra.node, holder, timeout=180)
        claim_and_pod(dra, other, "sm-sharing.gpu.gpufrac.io", "10Gi")
        device = wait_until(lambda: allocated_device(dra, other), 60, "the sm-sharing claim allocated", interval=1)
        assert allocated_device(dra, holder) == "gpu-0-time-slicing"
        assert device is not None and device.endswith("-sm-sharing") and not device.startswith("gpu-0-"), device
    finally:
        delete(dra, holder, other)


def test_a_restarted_driver_keeps_running_pods_and_unprepares_after_the_restart(dra: Dra) -> None:
    name = unique("dra-restart")
    claim_and_pod(dra, name, "time-slicing.gpu.gpufrac.io", "20Gi")
    try:
        wait_running(dra.node, name, timeout=180)
        uid = get_json(dra.node, "get", "resourceclaim", name, "-n", USER_NAMESPACE)["metadata"]["uid"]
        dra.plugin.stop()  # the agent goes away: the kubelet deregisters the driver
        restarted = dra.restarted_driver()
        assert uid in restarted.prepared
        dra.plugin = DraPlugin(DRIVER, dra.plugin.endpoint, dra.plugin.registration_socket, restarted)
        dra.driver = restarted
        dra.plugin.start()
        assert dra.plugin.registration.registered.wait(60), dra.plugin.registration.error
        assert exec_in(dra.node, name, LIST).split() == ["nvidia0", "LIMIT=20480", "REQUEST=20480"]
    finally:
        delete(dra, name)
    wait_until(lambda: not ClaimSpecs(dra.node.cdi_dir).exists(uid), 60, "the claim's spec removed", interval=1)
    assert restarted.prepared == {}
