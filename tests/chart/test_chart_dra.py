"""The chart's DRA front door (dra.enabled, docs/dra.md): off by default; on, three DeviceClasses whose CEL selects
exactly the devices of their mode among those the agent publishes, and the agent's rights to publish its
ResourceSlices and read the claims it prepares."""

from __future__ import annotations

from typing import Any

import pytest

from gpufrac.agent.decide.model import GpuInfo
from gpufrac.agent.dra.decide.cdi_dirs import cdi_dir_problem
from gpufrac.agent.dra.decide.slices import SliceGpu, resource_slices
from testkit.cel import evaluate
from testkit.chart import CHART, find, needs_helm, one, render, template

pytestmark = needs_helm

DRA = ["--set", "dra.enabled=true"]
CLASSES = {"time-slicing.gpu.gpufrac.io": "time-slicing", "sm-sharing.gpu.gpufrac.io": "sm-sharing",
           "gpu.gpufrac.io": "whole"}


def published_devices() -> list[dict[str, Any]]:
    """The devices of a two-GPU node, as the CEL of a DeviceClass sees each: its driver and its attributes by
    domain (an unqualified attribute belongs to the driver's domain)."""
    gpus = [SliceGpu(GpuInfo(i, f"GPU-{i}", "NVIDIA H100", 80 << 30), 80 << 30) for i in range(2)]
    _, devices = resource_slices("node-a", gpus, "615.10", 1)
    return [{"name": d["name"], "driver": "gpu.gpufrac.io",
             "attributes": {"gpu.gpufrac.io": {k: next(iter(v.values())) for k, v in d["attributes"].items()}}}
            for d in devices["spec"]["devices"]]


def test_dra_is_off_by_default() -> None:
    objs = render()
    assert find(objs, "DeviceClass") == []
    assert not [o for o in find(objs, "ClusterRole") if o["metadata"]["name"].endswith("-dra")]


@pytest.mark.parametrize(("name", "mode"), CLASSES.items())
def test_each_device_class_selects_exactly_its_modes_devices(name: str, mode: str) -> None:
    device_class = one(render(*DRA), "DeviceClass", name)
    [selector] = device_class["spec"]["selectors"]
    expression = selector["cel"]["expression"]
    chosen = [d["name"] for d in published_devices() if evaluate(expression, device=d)]
    suffix = "" if mode == "whole" else f"-{mode}"
    assert chosen == [f"gpu-0{suffix}", f"gpu-1{suffix}"]
    other_driver = {**published_devices()[0], "driver": "gpu.example.com"}
    assert not evaluate(expression, device=other_driver)


def test_the_agent_may_publish_slices_and_read_claims_and_nothing_more() -> None:
    objs = render(*DRA)
    role = one(objs, "ClusterRole", "gpufrac-agent-dra")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules == {
        (("resource.k8s.io",), ("resourceslices",)): {"get", "list", "watch", "create", "update", "patch", "delete"},
        (("resource.k8s.io",), ("resourceclaims",)): {"get", "list", "watch"},
        (("",), ("nodes",)): {"list"},  # its own node's labels, from the watch cache
    }
    binding = one(objs, "ClusterRoleBinding", "gpufrac-agent-dra")
    assert binding["roleRef"]["name"] == "gpufrac-agent-dra"
    assert [(s["kind"], s["name"]) for s in binding["subjects"]] == [("ServiceAccount", "gpufrac-agent")]


@pytest.mark.parametrize(("flag", "message"), [
    ("dra.cdiDir=var/run/cdi", "/dra/cdiDir"),
    ("dra.enabled=maybe", "/dra/enabled"),
    ("dra.defaultFrontDoor=both", "/dra/defaultFrontDoor"),
])
def test_bad_dra_values_are_refused_by_the_schema(flag: str, message: str) -> None:
    refused = template("--set-string" if "maybe" in flag else "--set", flag, check=False)
    assert refused.returncode != 0 and message in refused.stderr


@pytest.mark.parametrize("door", ["dra", "annotations"])
def test_the_agent_gets_the_default_front_door_and_may_read_its_node_for_the_label(door: str) -> None:
    objs = render(*DRA, "--set", f"dra.defaultFrontDoor={door}")
    [agent] = one(objs, "DaemonSet", "gpufrac-agent")["spec"]["template"]["spec"]["containers"][:1]
    args = agent["args"]
    assert args[args.index("--dra-default-front-door") + 1] == door
    rules = one(objs, "ClusterRole", "gpufrac-agent")["rules"]
    assert any("nodes" in r["resources"] and "get" in r["verbs"] for r in rules)


def agent_args(*values: str) -> list[str]:
    [agent] = one(render(*DRA, *values), "DaemonSet", "gpufrac-agent")["spec"]["template"]["spec"]["containers"][:1]
    return list(agent["args"])


def values_after(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, arg in enumerate(args) if arg == flag]


@pytest.mark.parametrize("values", [[], ["-f", str(CHART / "values-local.yaml")]])
def test_the_agent_is_told_the_runtimes_cdi_directories_and_the_claims_specs_go_to_one_of_them(
        values: list[str]) -> None:
    """The agent checks it (decide.dra_cdi_dirs): the local cluster's containerd reads only the node's own
    directory, where values-local.yaml puts the claims' specs too."""
    args = agent_args(*values)
    [host_dir] = values_after(args, "--dra-cdi-host-dir")
    runtime_dirs = values_after(args, "--dra-runtime-cdi-dir")
    assert runtime_dirs and cdi_dir_problem(host_dir, runtime_dirs) is None
    assert cdi_dir_problem(host_dir, ["/etc/cdi"] if host_dir != "/etc/cdi" else ["/var/run/cdi"]) is not None


def test_the_whole_gpu_class_serves_an_extended_resource_and_the_shares_do_not() -> None:
    objs = render(*DRA)
    assert one(objs, "DeviceClass", "gpu.gpufrac.io")["spec"]["extendedResourceName"] == "gpu.gpufrac.io/gpu"
    for name in ("time-slicing.gpu.gpufrac.io", "sm-sharing.gpu.gpufrac.io"):
        assert "extendedResourceName" not in one(objs, "DeviceClass", name)["spec"]
    off = render(*DRA, "--set", "dra.extendedResourceName=")
    assert "extendedResourceName" not in one(off, "DeviceClass", "gpu.gpufrac.io")["spec"]
