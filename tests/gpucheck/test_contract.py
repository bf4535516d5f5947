"""gpucheck restates gpufrac's contract so that it runs on a bare node: every value, path, format and rule it restates
equals gpufrac's own (the agent, the webhook, gpufrac.core.contract), the pods of its runtime rows are what
gpufrac's NRI plugin decides on, and its DRA row's claim gets what the DRA driver and the agent's loop give it."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from gpucheck import contract as restated
from gpucheck.checks.dra import Claim, quarter_claim
from gpucheck.checks.escapes import NAMESPACE
from gpucheck.cli import parse_args
from gpucheck.run import Run
from gpucheck.session import Session
from gpufrac.agent.decide import capabilities, mps_limits, mps_namespaces
from gpufrac.agent.decide.model import GpuInfo, Inventory
from gpufrac.agent.decide.mps_config import daemon_spec, render_config
from gpufrac.agent.dra.decide.claims import read_claim
from gpufrac.agent.dra.decide.prepare import DraNode, cdi_spec, prepare
from gpufrac.agent.dra.decide.slices import SliceGpu
from gpufrac.agent.dra.decide.tenants import claim_tenants
from gpufrac.agent.node.agent_config import AgentConfig
from gpufrac.agent.nri.decide.creation import (
    CDI_KINDS,
    ContainerInfo,
    Injection,
    NodeFacts,
    Outcome,
    PodInfo,
    decide,
)
from gpufrac.core import contract
from gpufrac.core.annotations import CANONICAL_PREFIX, NVIDIA_PREFIX, CanonicalField, ComputeMode
from gpufrac.core.contract import DEFAULT_MPS_ROOT, Delivery, LimitEnv
from gpufrac.webhook.decide.fractions import ContainerFraction, Memory, PodFractions
from gpufrac.webhook.decide.mutation import canonical_annotations, injected_env, injected_mounts, injected_volumes
from gpufrac.webhook.decide.policy import Policy

# ---- the restated contract equals gpufrac's own ----


def test_modes_paths_and_env_names_are_gpufracs() -> None:
    assert restated.MODES == tuple(str(m) for m in ComputeMode)
    assert (restated.TIME_SLICING, restated.SM_SHARING) == (ComputeMode.TIME_SLICING, ComputeMode.SM_SHARING)
    config = AgentConfig(node="n")
    assert restated.GPUFRAC_MPS_ROOT == DEFAULT_MPS_ROOT == str(config.mps_root)
    assert restated.GPUFRAC_MPS_LOG_ROOT == str(config.mps_log_root)
    assert restated.GPUFRAC_MPS_CONFIG_DIR == str(config.mps_config_dir)
    assert restated.ENV_PIPE_DIRECTORY == LimitEnv.PIPE_DIRECTORY
    assert restated.ENV_PINNED_MEM_LIMIT == LimitEnv.PINNED_MEM_LIMIT
    assert restated.ENV_MEMORY_REQUEST == LimitEnv.MEMORY_REQUEST
    assert restated.ENV_MEMORY_LIMIT == LimitEnv.MEMORY_LIMIT
    assert restated.MIN_DRIVER_MAJOR == capabilities.MIN_DRIVER_MAJOR
    assert restated.MIN_CUDA_DRIVER_VERSION == capabilities.MIN_CUDA_DRIVER_VERSION
    assert restated.MIB == contract.MIB
    for mode in ComputeMode:  # the pipe directory and its control socket
        layout = restated.daemon_layout("/r", str(mode))
        assert layout.pipe_dir == contract.mps_pipe_dir("/r/mps", mode)
        assert os.path.basename(layout.control_socket) == contract.MPS_CONTROL_SOCKET


def test_clients_and_daemons_start_from_an_env_without_the_callers_limits(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LimitEnv:
        monkeypatch.setenv(name, "0=1M")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    session = Session(parse_args(["--cuda", "none", "--workdir", str(tmp_path)]))
    base = session.base_env()
    assert not [k for k in base if k.startswith(contract.LIMIT_ENV_PREFIXES) or k == "CUDA_VISIBLE_DEVICES"]
    assert base["PATH"] == os.environ["PATH"]
    session.node.gpu_uuid = "GPU-x"
    env = session.client_env("/p", {restated.ENV_PINNED_MEM_LIMIT: "0=2M"})
    assert (env[restated.ENV_PIPE_DIRECTORY], env["CUDA_VISIBLE_DEVICES"], env[restated.ENV_PINNED_MEM_LIMIT]) == (
        "/p", "GPU-x", "0=2M")
    assert restated.ENV_MEMORY_LIMIT not in env


@pytest.mark.parametrize("mode", list(ComputeMode))
@pytest.mark.parametrize("mps_v3", [True, False])
def test_daemon_layout_argv_env_and_config_are_the_agents(tmp_path: Path, mode: ComputeMode, mps_v3: bool) -> None:
    base = {"PATH": "/usr/bin", "HOME": "/root"}
    spec = daemon_spec(mode, mps_v3=mps_v3, binary="/usr/bin/nvidia-cuda-mps-control", mps_root=tmp_path / "mps",
                       log_root=tmp_path / "log", config_dir=tmp_path / "config", base_env=base)
    layout = restated.daemon_layout(str(tmp_path), str(mode))
    assert layout.pipe_dir == str(spec.pipe_dir)
    assert layout.log_dir == str(spec.log_dir)
    assert layout.control_socket == str(spec.control_socket)
    assert restated.daemon_argv("/usr/bin/nvidia-cuda-mps-control", str(mode), mps_v3, layout.config_path) == spec.argv
    assert restated.daemon_env(base, layout) == spec.env
    if mps_v3:
        assert layout.config_path == str(spec.config_path)
        assert restated.render_config(str(mode)) == spec.config_text == render_config(mode)
        assert restated.render_config(str(mode), audit_log=False) == render_config(mode, audit_log=False)
    else:
        assert spec.config_path is None


@pytest.mark.parametrize(("limit_mib", "devices"), [(954, 1), (61440, 2), (1, 8)])
def test_limit_values_are_formatted_as_the_webhook_writes_them(limit_mib: int, devices: int) -> None:
    assert restated.format_pinned_mem_limit(limit_mib, devices) == contract.format_pinned_mem_limit(
        contract.pinned_limits(limit_mib, devices))
    assert contract.parse_pinned_mem_limit(restated.format_pinned_mem_limit(limit_mib, devices)) == dict.fromkeys(
        range(devices), limit_mib)
    fraction = ContainerFraction("app", ComputeMode.SM_SHARING, devices, Memory(limit_mib // 2 or 1, limit_mib),
                                 None, ())
    written = canonical_annotations(PodFractions({"app": fraction}, {}))
    env = {e["name"]: e for e in injected_env("app", ComputeMode.SM_SHARING, Policy())}

    def annotation_behind(name: str) -> str:  # the env var's value is the annotation its fieldRef names
        path = env[name]["valueFrom"]["fieldRef"]["fieldPath"]
        return written[re.fullmatch(r"metadata\.annotations\['(.+)'\]", path)[1]]

    assert annotation_behind(restated.ENV_MEMORY_REQUEST) == restated.memory_env_value(limit_mib // 2 or 1)
    assert annotation_behind(restated.ENV_MEMORY_LIMIT) == restated.memory_env_value(limit_mib)
    assert annotation_behind(restated.ENV_PINNED_MEM_LIMIT) == restated.format_pinned_mem_limit(limit_mib, devices)
    assert any(k.endswith(str(CanonicalField.MPS_PINNED_MEM_LIMIT)) for k in written)


def test_pods_get_the_pipe_directory_at_its_host_path_as_the_webhook_mounts_it(tmp_path: Path) -> None:
    for policy in (Policy(), Policy(delivery=Delivery.HOST_PATH)):
        for mode in ComputeMode:  # the pod emulation binds the pipe directory at the same path, like the webhook
            pipe_mount, shm_mount = injected_mounts(mode, policy)
            assert pipe_mount["mountPath"] == policy.mps_dirs[mode]
            assert shm_mount["mountPath"] == "/dev/shm"
            assert injected_env("c", mode, policy)[-1] == {"name": restated.ENV_PIPE_DIRECTORY,
                                                           "value": policy.mps_dirs[mode]}
            if policy.delivery is Delivery.HOST_PATH:  # the CSI driver binds the same host directory there
                assert injected_volumes(mode, policy)[0]["hostPath"]["path"] == policy.mps_dirs[mode]
    policy = Policy()
    run = Run(parse_args(["--workdir", str(tmp_path)]))
    run.session.node.mps_control = "/bin/true"
    spec = run.pods.spec(shm_delivered=True)
    assert spec["deliver"] == [{"source": spec["pipe_dir"], "target": spec["pipe_dir"]}]
    assert str(tmp_path) in spec["hide"]


@pytest.mark.parametrize(("driver", "cuda"), [("615.20", 13040), ("615.20", 13030), ("614.99", 13040),
                                              ("580.95.05", 13000), ("620.1", 13050), ("garbage", 13040)])
def test_driver_limits_and_served_modes_decide_as_the_agent(driver: str, cuda: int) -> None:
    inventory = Inventory(driver, cuda, (GpuInfo(0, "GPU-a", "H200", 1 << 30),))
    expected = capabilities.has_driver_memory_limits(inventory)
    assert restated.has_driver_memory_limits(driver, cuda) == expected
    assert restated.modes_to_serve(expected) == tuple(
        str(m) for m in capabilities.modes_to_serve(inventory, tuple(ComputeMode)))


# ---- 8: the runtime checks' pods are what gpufrac's plugin decides on ----


def test_the_runtime_checks_pods_are_what_the_plugin_injects_and_voids() -> None:
    """8a's pod is a bound fraction as the webhook and the scheduler leave it (its GPU named by the device plugin's
    CDI name): gpufrac's own NRI decision hands it exactly that CDI device. 8b's plain pod asks for every GPU by env:
    the decision voids it. So a FAIL on a node is the node's, not a pod the plugin never meant to serve."""
    uuid = "GPU-11111111-2222-3333-4444-555555555555"
    devices = f"{restated.DEVICE_PLUGIN_CDI_KIND}={uuid}"
    annotations = restated.fraction_annotations(restated.FRACTION_CONTAINER, restated.SM_SHARING, 1024, 2048, devices)
    assert annotations == contract.write_canonical([contract.CanonicalFraction(
        restated.FRACTION_CONTAINER, ComputeMode.SM_SHARING, 1024, 2048, {0: 2048}, (devices,))])
    pipe_dir = str(contract.mps_pipe_dir(DEFAULT_MPS_ROOT, ComputeMode.SM_SHARING))
    env = restated.fraction_env(1024, 2048, pipe_dir, devices)
    resolved = {}  # the webhook's env as the kubelet resolves it against these annotations ("" when one is absent)
    for var in injected_env(restated.FRACTION_CONTAINER, ComputeMode.SM_SHARING, Policy()):
        field = var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
        key = field.removeprefix("metadata.annotations['").removesuffix("']")
        resolved[var["name"]] = var["value"] if "value" in var else annotations.get(key, "")
    assert {name: value for name, value in resolved.items() if value} == env
    assert restated.DEVICE_PLUGIN_CDI_KIND == CDI_KINDS[0]  # the device plugin's kind, the agent's first
    assert (restated.CANONICAL_PREFIX, restated.NVIDIA_PREFIX) == (CANONICAL_PREFIX, NVIDIA_PREFIX)
    facts = NodeFacts(gpus=(GpuInfo(0, uuid, "NVIDIA H200", 143771 << 20),), cdi_devices=frozenset({devices}),
                      not_served=dict.fromkeys(ComputeMode))
    pod = PodInfo("gpufrac-gpu-check", "gpu-check-cdi", "u1", annotations)
    fraction = decide(pod, ContainerInfo("c1", restated.FRACTION_CONTAINER, env), facts)
    assert isinstance(fraction, Injection) and fraction.outcome is Outcome.INJECTED, fraction
    assert fraction.cdi_devices == (devices,)
    plain = decide(PodInfo("gpufrac-gpu-check", "gpu-check-plain", "u2", {}),
                   ContainerInfo("c2", "plain", {"NVIDIA_VISIBLE_DEVICES": "all"}), facts)
    assert isinstance(plain, Injection) and plain.outcome is Outcome.VOIDED and not plain.cdi_devices


# ---- 10: the DRA row's client gets what Prepare and the agent's loop give a container of the same claim ----

FAKE_H200 = GpuInfo(0, "GPU-00000000-fake-0000-0000-000000000000", "NVIDIA H200", 143771 << 20)


def sm_sharing_claim(claim: Claim, gpu: GpuInfo) -> dict[str, object]:
    """A ResourceClaim allocated on the GPU's sm-sharing device, as the kube-scheduler leaves it: `claim`'s memory and
    compute consumed, and a GpuConfig with its limit where that is above the request."""
    result = {"request": "gpu", "driver": "gpu.gpufrac.io", "pool": "node-a", "device": f"gpu-{gpu.index}-sm-sharing",
              "shareID": "share-1", "consumedCapacity": {"memory": f"{claim.request_mib}Mi",
                                                         "compute": str(claim.compute_percent)}}
    config = [{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpu.gpufrac.io", "parameters": {
        "apiVersion": "gpu.gpufrac.io/v1alpha1", "kind": "GpuConfig", "memoryLimit": f"{claim.limit_mib}Mi"}}}]
    return {"metadata": {"namespace": "team", "name": "claim-1", "uid": "uid-1"}, "status": {"allocation": {
        "devices": {"results": [result], "config": config if claim.limit_mib != claim.request_mib else []}}}}


@pytest.mark.parametrize(("gpu", "claim"), [
    (FAKE_H200, quarter_claim(FAKE_H200.memory_total_mib)),  # the row's claim on the fakes' (and an H200's) GPU
    (GpuInfo(0, "GPU-a100", "NVIDIA A100-SXM4-80GB", 81920 << 20), quarter_claim(81920)),
    (GpuInfo(2, "GPU-b", "NVIDIA L4", 23034 << 20), Claim(1024, 4096, 100)),  # a limit above the request
    (FAKE_H200, Claim(20480, 20481, 1)),
])
def test_the_dra_rows_env_and_daemon_limits_are_what_prepare_and_the_agent_give_the_claim(
        tmp_path: Path, gpu: GpuInfo, claim: Claim) -> None:
    """Row 10's env (contract.claim_env, what the row starts its client with) equals the env in the CDI spec the DRA
    driver writes for the same claim on the same GPU, with the check's own sm-sharing pipe directory as the node's; and
    what the row tells the daemon (contract.daemon_limit_commands) is what the agent's loop tells it for that claim."""
    layout = restated.daemon_layout(str(tmp_path), restated.SM_SHARING)
    toolkit = f"nvidia.com/gpu={gpu.uuid}"
    node = DraNode(name="node-a", gpus={gpu.index: SliceGpu(gpu, gpu.memory_total_bytes)},
                   mps_root=str(tmp_path / "mps"), mps_modes=frozenset({str(ComputeMode.SM_SHARING)}),
                   cdi_devices=frozenset({toolkit}), host_devices=frozenset({"/dev/nvidiactl"}))
    prepared = prepare(read_claim(sm_sharing_claim(claim, gpu)), node, ())
    [device] = prepared.devices
    assert (device.request_mib, device.limit_mib, device.compute_percent) == (
        claim.request_mib, claim.limit_mib, claim.compute_percent)
    ours = restated.claim_env(gpu.uuid, layout.pipe_dir, claim.request_mib, claim.limit_mib, claim.compute_percent)
    spec = cdi_spec(prepared, node)
    assert spec is not None
    [edits] = [d["containerEdits"] for d in spec["devices"]]
    assert dict(e.split("=", 1) for e in edits["env"]) == ours
    pipe_mount = edits["mounts"][0]  # the pipe directory at its host path, where the row's client finds it
    assert pipe_mount["hostPath"] == pipe_mount["containerPath"] == ours[restated.ENV_PIPE_DIRECTORY]
    assert restated.ENV_ACTIVE_THREAD_PERCENTAGE == LimitEnv.ACTIVE_THREAD_PERCENTAGE
    # without the toolkit's CDI device for the GPU, Prepare adds only the env NVIDIA's runtime reads (CUDA's view of
    # one GPU, which the row's client gets as CUDA_VISIBLE_DEVICES=<uuid>)
    bare = dataclasses.replace(node, cdi_devices=frozenset())
    bare_spec = cdi_spec(prepare(read_claim(sm_sharing_claim(claim, gpu)), bare, ()), bare)
    assert bare_spec is not None
    assert dict(e.split("=", 1) for e in bare_spec["devices"][0]["containerEdits"]["env"]) == {
        **ours, LimitEnv.VISIBLE_DEVICES: gpu.uuid}
    plan = mps_limits.plan(claim_tenants([prepared]).tenants, [gpu])
    servers = [4242, 4343]
    assert restated.daemon_limit_commands(gpu.uuid, claim.limit_mib, claim.compute_percent, servers) == (
        plan.default_commands() + plan.server_commands(servers))


def test_the_daemon_side_rows_tell_the_pinned_limit_as_the_agent_does() -> None:
    """Rows 9 tell the daemon a pinned limit alone: the agent's commands for it, less the thread percentage."""
    plan = mps_limits.DaemonPlan((mps_limits.GpuCeiling(FAKE_H200.uuid, 2048, {"a/b/c": 2048}),))
    assert restated.daemon_limit_commands(FAKE_H200.uuid, 2048, None, [7]) == (
        plan.default_commands() + plan.server_commands([7]))


def test_the_namespace_row_makes_a_namespace_as_the_agent_does() -> None:
    """Row 9c makes its namespace with the agent's words, on the agent's server, in a name of the agent's shape."""
    made = mps_namespaces.Namespace(NAMESPACE, 2048, 100, "a/b/c")
    assert restated.namespace_commands(NAMESPACE, 2048, 100) == [list(made.create()), list(made.set_limits())]
    assert restated.namespace_delete(NAMESPACE) == list(mps_namespaces.delete_command(NAMESPACE))
    assert restated.NAMESPACE_SERVER == mps_namespaces.SERVER and mps_namespaces.is_ours(NAMESPACE)
