"""The real node's fake GPUs are devices containerd hands out for real: a CDI name of the spec `nvidia-ctk cdi
generate` wrote for the node (`nvidia.com/gpu=1`, `nvidia.com/gpu=GPU-<uuid>`) resolves to /dev/nvidia1 and the
control devices inside the container, with NVIDIA's numbers and a device cgroup that lets the container open them
(ENXIO: no driver behind them), by a path with no gpufrac code in it (a test device plugin's Allocate answer
carrying CDI devices). An unknown name fails the container, and a plain pod sees no NVIDIA device at all.
(NVIDIA's device plugin's own kind, `k8s.device-plugin.nvidia.com/gpu`: tests/node/test_nvidia_stack_real_node.py.)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from e2e.names import NODE_NAME, USER_NAMESPACE
from e2e.node import APP_IMAGE, GPU_UUIDS, RealCluster
from e2e.pods import create, events, get_json, get_pod
from e2e.testing import pod, unique
from e2e.toolkit import gpu_devices
from e2e.toolkit.wait import wait_until
from testkit.device_plugin import CdiDevicePlugin, generate_stubs

pytestmark = [pytest.mark.e2e, pytest.mark.real_node]

CONTROL = set(gpu_devices.CONTROL_DEVICES)
# What the container prints: its NVIDIA device nodes (name, numbers, whether it may open them) and the CDI spec's env.
LIST_DEVICES = f"{gpu_devices.PROBE_COMMAND}; echo NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory):
    return generate_stubs(tmp_path_factory.mktemp("deviceplugin-stubs"))


@pytest.fixture
def plugin(node: RealCluster, stubs, request: pytest.FixtureRequest) -> Iterator[CdiDevicePlugin]:
    """A device plugin of a resource of its own whose one device is the CDI names `request.param`."""
    resource = f"e2e.gpufrac.io/{unique('cdi')}"
    with CdiDevicePlugin(stubs, resource, "dev-1", request.param) as dp:
        wait_until(lambda: allocatable(node).get(resource) == "1", 60, f"{resource} allocatable on the node",
                   interval=0.5)
        yield dp


def allocatable(node: RealCluster) -> dict[str, str]:
    return get_json(node, "get", "node", NODE_NAME)["status"].get("allocatable", {})


def listing_pod(name: str, resource: str | None = None) -> dict:
    """A pod for the default scheduler whose container lists its NVIDIA devices and exits."""
    ctr: dict = {"name": "app", "image": APP_IMAGE, "imagePullPolicy": "Never", "command": ["sh", "-c", LIST_DEVICES]}
    if resource:
        ctr["resources"] = {"limits": {resource: "1"}}
    return pod(name, containers=[ctr], schedulerName="default-scheduler", restartPolicy="Never",
               terminationGracePeriodSeconds=1)


def run_to_completion(node: RealCluster, name: str, resource: str | None = None) -> dict[str, object]:
    """Runs the listing pod; {device name: ('major:minor', open result)} and the env line it printed."""
    res = create(node, listing_pod(name, resource), user="admin")
    assert res.rc == 0, res.stderr
    try:
        wait_until(lambda: get_pod(node, name)["status"].get("phase") in ("Succeeded", "Failed"), 120,
                   f"pod {name} done", interval=0.5)
        assert get_pod(node, name)["status"]["phase"] == "Succeeded", get_pod(node, name)["status"]
        out = node.kubectl("logs", "-n", USER_NAMESPACE, name, user="admin", check=True).stdout
    finally:
        node.kubectl("delete", "pod", "-n", USER_NAMESPACE, name, "--wait=false", user="admin")
    seen: dict[str, object] = dict(gpu_devices.parse_probe(out))
    seen.update(("env", line) for line in out.splitlines() if line.startswith("NVIDIA_VISIBLE_DEVICES="))
    return seen


@pytest.mark.parametrize("plugin", [["nvidia.com/gpu=1"], [f"nvidia.com/gpu={GPU_UUIDS[1]}"]],
                         ids=["toolkit-index", "toolkit-uuid"], indirect=True)
def test_a_cdi_name_resolves_to_exactly_that_gpu_and_the_control_devices(node: RealCluster, plugin):
    seen = run_to_completion(node, unique("cdi"), plugin.resource)
    assert plugin.allocations == [["dev-1"]]
    devices = {k for k in seen if k != "env"}
    assert devices == {"nvidia1", *CONTROL}, seen
    # NVIDIA's numbers, and the container may open them (ENXIO: allowed by its device cgroup, no driver behind).
    assert seen["nvidia1"] == (f"{gpu_devices.NVIDIA_MAJOR}:1", "ENXIO"), seen
    assert all(seen[c][1] == "ENXIO" for c in CONTROL), seen  # type: ignore[index]
    assert seen["env"] == "NVIDIA_VISIBLE_DEVICES=void"  # the spec's containerEdits applied


@pytest.mark.parametrize("plugin", [["nvidia.com/gpu=7"]], ids=["unknown-index"], indirect=True)
def test_an_unknown_cdi_name_fails_the_container(node: RealCluster, plugin):
    name = unique("cdi-unknown")
    res = create(node, listing_pod(name, plugin.resource), user="admin")
    assert res.rc == 0, res.stderr
    try:
        def refused() -> str | None:
            msgs = [e.get("message", "") for e in events(node, name) if e.get("reason") == "Failed"]
            return next((m for m in msgs if "unresolvable CDI devices" in m), None)

        message = wait_until(refused, 120, f"pod {name}'s creation to fail on the CDI name", interval=0.5)

        def create_container_error() -> dict | None:
            # The kubelet posts the container's waiting reason after the event (seen: still ContainerCreating).
            status = get_pod(node, name)["status"]
            waiting = (status.get("containerStatuses") or [{}])[0].get("state", {}).get("waiting", {})
            return status if waiting.get("reason") == "CreateContainerError" else None

        status = wait_until(create_container_error, 60, f"pod {name}'s container to wait on CreateContainerError",
                            interval=0.5)
    finally:
        node.kubectl("delete", "pod", "-n", USER_NAMESPACE, name, "--wait=false", user="admin")
    assert "nvidia.com/gpu=7" in message
    assert status["phase"] == "Pending", status


def test_a_plain_pod_sees_no_nvidia_device(node: RealCluster):
    # The host has them (the harness made them), the pod asked for none.
    assert all(gpu_devices.is_fake(p) for p in gpu_devices.device_paths(len(GPU_UUIDS)))
    seen = run_to_completion(node, unique("plain"))
    assert {k for k in seen if k != "env"} == set(), seen
