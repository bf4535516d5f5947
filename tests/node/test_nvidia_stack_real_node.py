"""gpufrac beside NVIDIA's own node stack on the real node: NVIDIA's device plugin registering `nvidia.com/gpu`,
the CDI spec `nvidia-ctk cdi generate` wrote, containerd's `nvidia` runtime handler (nvidia-container-runtime,
configured by `nvidia-ctk runtime configure`) in the toolkit's default setting and in the hardened one
(`accept-nvidia-visible-devices-envvar-when-unprivileged = false`), with gpufrac installed by the README's
`helm install` and its default values.

What a container sees is read from inside it (gpu_devices.PROBE_COMMAND): each /dev/nvidia* node, its numbers and
whether its device cgroup lets the container open it (ENXIO: allowed, no driver behind it; EPERM: denied). The
fake GPUs carry NVIDIA's numbers (195:N), so a node that is present but not granted shows (EPERM), and the app
image carries the CUDA base image's `NVIDIA_VISIBLE_DEVICES=all`, so NVIDIA's runtime would hand every GPU to a
container whose env nobody voided: `test_the_leak_the_plain_pod_tests_guard_against_shows` proves both can fail.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from e2e.install import Helm
from e2e.names import KAI_CONDITIONS, NODE_NAME, RELEASE_NAMESPACE, USER_NAMESPACE
from e2e.node import APP_IMAGE, DEFAULT_STRATEGY, GPU_UUIDS, RealCluster
from e2e.pods import (
    SEED_BINDS,
    SEED_ENV,
    SEED_EXAMPLES,
    bind,
    exec_in,
    get_json,
    not_running_reasons,
    release_pods,
    wait_running,
)
from e2e.pods import create as create_as
from e2e.testing import example, unique
from e2e.toolkit import gpu_devices, nvidia_device_plugin, nvidia_toolkit
from e2e.toolkit.wait import WaitTimeoutError, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.real_node]

RESOURCES = Path(__file__).parent / "resources"
CONTROL = set(gpu_devices.CONTROL_DEVICES)
KAI_RESERVATION_NAMESPACE = "kai-resource-reservation"
TRUSTED_NAMESPACE = "kube-system"  # in the chart's default nri.trustedNamespaces: env grants kept
GRANTED = "ENXIO"  # the device cgroup allows the node (no driver answers it)
DENIED = "EPERM"
# Every NVIDIA_VISIBLE_DEVICES entry of the container's env (a name can be there twice: the image's and the pod's;
# NVIDIA's runtime reads the last).
PRINT_ENV = "tr '\\0' '\\n' < /proc/1/environ | grep '^NVIDIA_VISIBLE_DEVICES=' | sed 's/^/ENV /'"


# ---- helpers -------------------------------------------------------------------------------------------------


def probe_pod(name: str, namespace: str, *, gpus: int = 0, runtime_class: str | None = None,
              env: dict[str, str] | None = None) -> dict:
    """tests/node/resources/probe-pod.yaml: a pod for the default scheduler that prints what it sees and exits."""
    manifest = yaml.safe_load((RESOURCES / "probe-pod.yaml").read_text())
    manifest["metadata"] = {"name": name, "namespace": namespace}
    ctr = manifest["spec"]["containers"][0]
    ctr["image"] = APP_IMAGE
    ctr["command"] = ["sh", "-c", f"{gpu_devices.PROBE_COMMAND}; {PRINT_ENV}"]
    if gpus:
        ctr["resources"] = {"limits": {nvidia_device_plugin.RESOURCE: str(gpus)}}
    if env:
        ctr["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if runtime_class:
        manifest["spec"]["runtimeClassName"] = runtime_class
    return manifest


def fresh_namespace(node: RealCluster, name: str) -> str:
    """A namespace of the test's own (its default ServiceAccount made, so that pods are admitted)."""
    node.kubectl("create", "namespace", name, user="admin", check=False)
    wait_until(lambda: node.kubectl("get", "serviceaccount", "default", "-n", name, user="admin").rc == 0, 60,
               f"namespace {name}'s default ServiceAccount", interval=0.5)
    return name


REFUSED = "refused"  # run_probe's env value for a container gpufrac refused to create


def run_probe(node: RealCluster, manifest: dict, *, refusal_ok: bool = False) -> tuple[dict[str, tuple[str, str]], str]:
    """Runs the probe pod to completion: ({device: ('major:minor', open result)}, its NVIDIA_VISIBLE_DEVICES as the
    last entry of its env, which NVIDIA's runtime reads). `refusal_ok`: a container the runtime would not create
    (CreateContainerError, gpufrac's NRI plugin refusing it) counts as seeing nothing: ({}, REFUSED)."""
    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    res = node.kubectl("create", "-f", "-", user="admin", input=json.dumps(manifest))
    assert res.rc == 0, res.stderr

    def outcome() -> str | None:
        pod = json.loads(node.kubectl("get", "pod", name, "-n", namespace, "-o", "json", user="admin").stdout)
        waiting = (pod["status"].get("containerStatuses") or [{}])[0].get("state", {}).get("waiting", {})
        if refusal_ok and waiting.get("reason") == "CreateContainerError":
            return f"{REFUSED}: {waiting.get('message', '')}"
        phase = pod["status"].get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    try:
        done = wait_until(outcome, 120, f"pod {namespace}/{name} done", interval=0.5)
        if done.startswith(REFUSED):
            return {}, REFUSED
        out = node.kubectl("logs", "-n", namespace, name, user="admin", check=True).stdout
        assert done == "Succeeded", out
    finally:
        node.kubectl("delete", "pod", "-n", namespace, name, "--wait=false", user="admin")
    env = [line.split("=", 1)[1] for line in out.splitlines() if line.startswith("ENV NVIDIA_VISIBLE_DEVICES=")]
    return gpu_devices.parse_probe(out), env[-1] if env else ""


def gpus_seen(seen: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    return {k: v for k, v in seen.items() if k not in CONTROL}


def assert_exactly_gpus(seen: dict[str, tuple[str, str]], count: int) -> None:
    """`count` GPU device nodes with NVIDIA's numbers, each one granted, and the control devices granted."""
    gpus = gpus_seen(seen)
    assert len(gpus) == count, seen
    for dev, (numbers, result) in gpus.items():
        assert numbers == f"{gpu_devices.NVIDIA_MAJOR}:{int(dev.removeprefix('nvidia'))}", seen
        assert result == GRANTED, seen
    assert {k for k in seen if k in CONTROL} == CONTROL and all(seen[c][1] == GRANTED for c in CONTROL), seen


# ---- fixtures --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(node: RealCluster, installed: Helm) -> Iterator[RealCluster]:
    """The node with gpufrac installed by helm (default values), NVIDIA's device plugin in the node's default
    strategy (cdi-cri, as the GPU Operator runs it) and the toolkit in its default setting; put back so after this
    module."""
    yield node
    if node.toolkit is not None and node.toolkit.hardened():
        node.toolkit.set_hardened(False)
    if node.device_list_strategy != DEFAULT_STRATEGY:
        node.start_device_plugin(DEFAULT_STRATEGY)


@pytest.fixture
def strategy(stack: RealCluster, request: pytest.FixtureRequest) -> str:
    """NVIDIA's device plugin restarted with the device list strategy `request.param`."""
    if stack.device_list_strategy != request.param:
        stack.start_device_plugin(request.param)
    return str(request.param)


@pytest.fixture(params=["default", "hardened"])
def toolkit_setting(stack: RealCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """The toolkit's config.toml in NVIDIA's default setting or the hardened one (the runtime reads it on every
    container: no restart)."""
    assert stack.toolkit is not None
    stack.toolkit.set_hardened(request.param == "hardened")
    yield str(request.param)
    stack.toolkit.set_hardened(False)


def runtime_class_for(strategy: str) -> str | None:
    """envvar grants reach a container only through NVIDIA's runtime; CDI ones through containerd itself."""
    return nvidia_toolkit.RUNTIME_HANDLER if strategy == "envvar" else None


# ---- the device plugin ---------------------------------------------------------------------------------------


def test_the_nodes_gpus_are_allocatable_from_nvidias_device_plugin(stack: RealCluster):
    assert stack.allocatable().get(nvidia_device_plugin.RESOURCE) == str(len(GPU_UUIDS))
    stack.stop_device_plugin()
    try:
        # The kubelet drops the plugin's devices from allocatable once its socket is gone: they were its.
        wait_until(lambda: stack.allocatable().get(nvidia_device_plugin.RESOURCE) == "0", 60,
                   "nvidia.com/gpu allocatable 0 without the device plugin", interval=0.5)
    finally:
        stack.start_device_plugin(DEFAULT_STRATEGY)
    assert "Registered device plugin for 'nvidia.com/gpu' with Kubelet" in stack.log("nvidia-device-plugin").read_text()


def test_an_xid_error_takes_that_gpu_out_of_allocatable(stack: RealCluster):
    """Health checks on (no DP_DISABLE_HEALTHCHECKS): the plugin's NVML event set gets the fake's critical XID (79,
    fallen off the bus) and the kubelet stops offering that GPU."""
    state = stack.gpu_state()
    try:
        state.xid_error(GPU_UUIDS[3], 79)
        wait_until(lambda: stack.allocatable().get(nvidia_device_plugin.RESOURCE) == str(len(GPU_UUIDS) - 1), 60,
                   "the GPU with the XID error out of allocatable", interval=0.5)
    finally:
        stack.gpu_state()  # the fake's state afresh, without the XID
        stack.start_device_plugin(DEFAULT_STRATEGY)  # a restarted plugin finds every GPU healthy again
    assert stack.allocatable().get(nvidia_device_plugin.RESOURCE) == str(len(GPU_UUIDS))


def test_the_device_plugins_cdi_strategy_writes_its_spec_of_the_fake_gpus(stack: RealCluster):
    stack.start_device_plugin("cdi-cri")
    spec = json.loads(nvidia_device_plugin.spec_path(stack.cdi_dir).read_text())
    assert spec["kind"] == nvidia_device_plugin.CDI_KIND
    assert sorted(d["name"] for d in spec["devices"]) == sorted(GPU_UUIDS)


# ---- NVIDIA's device plugin as NVIDIA's pod ----------------------------------------------------------------------

NVIDIA_DP_NAMESPACE = "nvidia-device-plugin"  # where NVIDIA's README installs its chart
NVIDIA_DP_SELECTOR = "app.kubernetes.io/name=nvidia-device-plugin"
REGISTERED = "Registered device plugin for 'nvidia.com/gpu' with Kubelet"


def device_plugin_daemonset(node: RealCluster) -> list[dict]:
    """tests/node/resources/nvidia-device-plugin.yaml (NVIDIA's chart's DaemonSet), its driver root and CDI
    directory pointed at the node's."""
    objs = list(yaml.safe_load_all((RESOURCES / "nvidia-device-plugin.yaml").read_text()))
    [ds] = [o for o in objs if o["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    host_paths = {"driver-root": node.driver_root, "gpu-fakes": node.gpu_fakes, "cdi-root": node.cdi_dir}
    for volume in pod["volumes"]:
        if volume["name"] in host_paths:
            volume["hostPath"]["path"] = str(host_paths[volume["name"]])
    [ctr] = pod["containers"]
    assert ctr["image"] == nvidia_device_plugin.IMAGE
    for var in ctr["env"]:
        if var["name"] == "NVIDIA_DRIVER_ROOT":
            var["value"] = str(node.driver_root)
    return objs


def running_device_plugin_pod(node: RealCluster, *, not_uid: str = "") -> dict:
    """The DaemonSet's pod, once it runs, its plugin registered `nvidia.com/gpu` with the kubelet and the node has
    its GPUs allocatable (a pod other than `not_uid`'s: the one the DaemonSet made again)."""
    def registered() -> dict | None:
        pods = get_json(node, "get", "pods", "-n", NVIDIA_DP_NAMESPACE, "-l", NVIDIA_DP_SELECTOR)["items"]
        for pod in pods:
            if pod["metadata"]["uid"] == not_uid or pod["metadata"].get("deletionTimestamp"):
                continue
            if pod["status"].get("phase") != "Running":
                continue
            logs = node.kubectl("logs", "-n", NVIDIA_DP_NAMESPACE, pod["metadata"]["name"], user="admin").stdout
            if REGISTERED in logs:
                return pod
        return None

    try:
        pod = wait_until(registered, 120, "NVIDIA's device plugin pod running and registered", interval=1)
    except WaitTimeoutError as exc:  # say why (gpufrac refusing it shows as CreateContainerError and its reason)
        found = get_json(node, "get", "node", NODE_NAME)
        pods = get_json(node, "get", "pods", "-n", NVIDIA_DP_NAMESPACE, "-l", NVIDIA_DP_SELECTOR)["items"]
        raise WaitTimeoutError(f"{exc}: {[not_running_reasons(p, found) for p in pods]}") from None
    # the kubelet's node status catches up with the registration a few seconds later
    wait_until(lambda: node.allocatable().get(nvidia_device_plugin.RESOURCE) == str(len(GPU_UUIDS)), 60,
               "nvidia.com/gpu allocatable from the device plugin's pod", interval=0.5)
    return pod


def container_env(node: RealCluster, pod: dict, name: str) -> list[str]:
    """Every `name=` entry of the pod's first container's env, read from inside it (NVIDIA's image has busybox)."""
    out = node.kubectl("exec", "-n", pod["metadata"]["namespace"], pod["metadata"]["name"], "--", "sh", "-c",
                       "tr '\\0' '\\n' < /proc/1/environ", user="admin", check=True).stdout
    return [line.split("=", 1)[1] for line in out.splitlines() if line.startswith(f"{name}=")]


@pytest.fixture
def device_plugin_pod(stack: RealCluster) -> Iterator[dict]:
    """NVIDIA's device plugin as NVIDIA deploys it, its chart's DaemonSet in `nvidia-device-plugin`, in place of
    the node's host process for the test (which is started again after). The host process is gone first and the
    node's `nvidia.com/gpu` with it, so what the node advertises after is the pod's."""
    stack.import_device_plugin_image()
    stack.stop_device_plugin()
    objs = device_plugin_daemonset(stack)
    try:
        wait_until(lambda: stack.allocatable().get(nvidia_device_plugin.RESOURCE) == "0", 60,
                   "nvidia.com/gpu allocatable 0 without the host's device plugin", interval=0.5)
        res = stack.kubectl("apply", "-f", "-", user="admin", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                               "items": objs}))
        assert res.rc == 0, res.stderr
        yield running_device_plugin_pod(stack)
    finally:
        stack.kubectl("delete", "daemonset", "-n", NVIDIA_DP_NAMESPACE, objs[1]["metadata"]["name"], "--wait=true",
                      "--timeout=60s", user="admin")
        wait_until(lambda: not get_json(stack, "get", "pods", "-n", NVIDIA_DP_NAMESPACE, "-l",
                                        NVIDIA_DP_SELECTOR)["items"], 60, "the device plugin's pods gone", interval=1)
        stack.start_device_plugin(DEFAULT_STRATEGY)


def test_nvidias_device_plugin_pod_comes_back_after_a_delete_and_serves_a_whole_gpu(stack: RealCluster,
                                                                                    device_plugin_pod: dict):
    """Issue 44: NVIDIA's device plugin as NVIDIA's chart installs it (its namespace, its image's and its
    DaemonSet's NVIDIA_VISIBLE_DEVICES=all, the kubelet's device-plugins directory bound in), with gpufrac installed:
    it runs with the env it asked for, is deleted, comes back (gpufrac's NRI plugin neither refuses nor voids it),
    and the node's `nvidia.com/gpu` it serves goes to a whole-GPU pod."""
    assert stack.allocatable().get(nvidia_device_plugin.RESOURCE) == str(len(GPU_UUIDS))
    # as the image and the DaemonSet both asked (containerd keeps one entry of the name): gpufrac voiding it would
    # read `void`; refusing the container (GPUEnvDuplicated) would leave no pod running
    assert container_env(stack, device_plugin_pod, "NVIDIA_VISIBLE_DEVICES") == ["all"]

    res = stack.kubectl("delete", "pod", "-n", NVIDIA_DP_NAMESPACE, device_plugin_pod["metadata"]["name"],
                        "--wait=false", user="admin")
    assert res.rc == 0, res.stderr
    again = running_device_plugin_pod(stack, not_uid=device_plugin_pod["metadata"]["uid"])
    assert container_env(stack, again, "NVIDIA_VISIBLE_DEVICES") == ["all"]

    # the chart's default device list strategy (envvar): the grant reaches the container through NVIDIA's runtime
    namespace = fresh_namespace(stack, unique("tenant-nvdp"))
    try:
        seen, _ = run_probe(stack, probe_pod("whole", namespace, gpus=1,
                                             runtime_class=nvidia_toolkit.RUNTIME_HANDLER))
    finally:
        stack.kubectl("delete", "namespace", namespace, "--wait=false", user="admin")
    assert_exactly_gpus(seen, 1)


def test_a_dcgm_shaped_pod_binding_the_device_plugins_directory_keeps_its_env(stack: RealCluster):
    """A pod shaped like NVIDIA's DCGM exporter or GPU feature discovery, in a namespace of its own (not one of
    NVIDIA's): the kubelet's device-plugins directory bound in and NVIDIA_VISIBLE_DEVICES=all in its image and its
    env. gpufrac recognises the GPU stack by that bind: the pod runs with the env it asked for."""
    namespace = fresh_namespace(stack, unique("dcgm-exporter"))
    manifest = probe_pod(unique("dcgm"), namespace, env={"NVIDIA_VISIBLE_DEVICES": "all"})
    manifest["spec"]["volumes"] = [{"name": "pod-gpu-resources",
                                    "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}}]
    manifest["spec"]["containers"][0]["volumeMounts"] = [{"name": "pod-gpu-resources",
                                                          "mountPath": "/var/lib/kubelet/device-plugins",
                                                          "readOnly": True}]
    try:
        _, env = run_probe(stack, manifest, refusal_ok=True)
    finally:
        stack.kubectl("delete", "namespace", namespace, "--wait=false", user="admin")
    assert env == "all"


# ---- whole GPUs from the device plugin --------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["envvar", "cdi-cri"], indirect=True)
@pytest.mark.parametrize("count", [1, 2])
def test_a_tenant_pod_asking_whole_gpus_sees_exactly_that_many(stack: RealCluster, strategy: str, count: int,
                                                               toolkit_setting: str):
    namespace = fresh_namespace(stack, unique(f"tenant-{strategy}"))
    try:
        seen, _ = run_probe(stack, probe_pod("whole", namespace, gpus=count, runtime_class=runtime_class_for(strategy)))
    finally:
        stack.kubectl("delete", "namespace", namespace, "--wait=false", user="admin")
    if strategy == "envvar" and toolkit_setting == "hardened":
        # NVIDIA's hardened setting takes no GPU list from an unprivileged container's env, whoever wrote it (the
        # device plugin here): NVIDIA's answer is a CDI or volume-mounts strategy, not gpufrac's to change.
        assert gpus_seen(seen) == {}, seen
    else:
        assert_exactly_gpus(seen, count)


@pytest.mark.parametrize("strategy", ["envvar", "cdi-cri"], indirect=True)
def test_a_kai_reservation_pod_keeps_its_gpu(stack: RealCluster, strategy: str):
    fresh_namespace(stack, KAI_RESERVATION_NAMESPACE)
    seen, env = run_probe(stack, probe_pod(unique("reservation"), KAI_RESERVATION_NAMESPACE, gpus=1,
                                           runtime_class=runtime_class_for(strategy)))
    # Exactly one GPU: under envvar it reaches the container only through NVIDIA_VISIBLE_DEVICES, so a voided env
    # (gpufrac taking the grant) would show none. The value left inside is NVIDIA's runtime's: its jit-cdi edits end
    # with NVIDIA_VISIBLE_DEVICES=void, as its generated specs do, whatever the grant was.
    assert_exactly_gpus(seen, 1)
    assert env in (*GPU_UUIDS, "void"), env


# ---- gpufrac's fractions and plain pods, under each runtime handler and toolkit setting ---------------------------


@pytest.mark.parametrize("handler", ["runc", nvidia_toolkit.RUNTIME_HANDLER])
def test_the_seed_fractions_see_exactly_their_gpus_from_the_generated_spec(stack: RealCluster, toolkit_setting: str,
                                                                          handler: str):
    generated = stack.cdi_spec.read_text()
    assert "nvidia-cdi-hook" in generated  # nvidia-ctk's spec: its hooks (no hand-written spec has them)
    for seed in ("inference", "notebook"):
        name = unique(f"{seed}-{handler}-{toolkit_setting}")
        manifest = example(SEED_EXAMPLES[seed][0], name)
        manifest["spec"]["terminationGracePeriodSeconds"] = 1
        if handler != "runc":
            manifest["spec"]["runtimeClassName"] = handler
        res = create_as(stack, manifest)
        assert res.rc == 0, res.stderr
        try:
            bind(stack, name, SEED_BINDS[seed])
            wait_running(stack, name)
            out = exec_in(stack, name, gpu_devices.PROBE_COMMAND + "; env")
        finally:
            stack.kubectl("delete", "pod", "-n", USER_NAMESPACE, name, "--wait=false", user="admin")
        bound = SEED_BINDS[seed]["nvidia.com/container.app.gpus.devices"].split(",")
        seen = gpu_devices.parse_probe(out)
        assert sorted(gpus_seen(seen)) == sorted(f"nvidia{GPU_UUIDS.index(u)}" for u in bound), (seed, seen)
        assert_exactly_gpus(seen, len(bound))
        env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line and not line.startswith("DEV "))
        assert {k: env.get(k) for k in SEED_ENV[seed]} == SEED_ENV[seed], (seed, env)


@pytest.mark.parametrize("handler", ["runc", nvidia_toolkit.RUNTIME_HANDLER])
@pytest.mark.parametrize("named_in", ["image", "pod"])
def test_a_plain_pod_naming_all_gpus_sees_none(stack: RealCluster, toolkit_setting: str, handler: str, named_in: str):
    """The CUDA image's own NVIDIA_VISIBLE_DEVICES=all, or the pod's env naming it again (the container then has the
    name twice: NVIDIA's runtime reads the last entry): no GPU either way, or the creation refused."""
    namespace = fresh_namespace(stack, unique("plain"))
    try:
        seen, env = run_probe(stack, probe_pod("plain", namespace,
                                               env={"NVIDIA_VISIBLE_DEVICES": "all"} if named_in == "pod" else None,
                                               runtime_class=None if handler == "runc" else handler),
                              refusal_ok=True)
    finally:
        stack.kubectl("delete", "namespace", namespace, "--wait=false", user="admin")
    assert seen == {}, seen
    assert env in ("void", REFUSED), env  # what NVIDIA's runtime would read grants nothing


def test_the_leak_the_plain_pod_tests_guard_against_shows(stack: RealCluster):
    """The same plain pod where gpufrac leaves env grants alone (a trusted namespace): NVIDIA's runtime hands it
    every GPU from the image's NVIDIA_VISIBLE_DEVICES=all, granted. And a device node that reaches a container
    without a grant (a hostPath) is there but cannot be opened. Both would pass unnoticed with /dev/null's
    numbers and an image without CUDA's env."""
    seen, _ = run_probe(stack, probe_pod(unique("leak"), TRUSTED_NAMESPACE,
                                         runtime_class=nvidia_toolkit.RUNTIME_HANDLER))
    assert_exactly_gpus(seen, len(GPU_UUIDS))

    manifest = probe_pod(unique("hostpath"), TRUSTED_NAMESPACE)
    manifest["spec"]["volumes"] = [{"name": "gpu", "hostPath": {"path": "/dev/nvidia1", "type": "CharDevice"}}]
    manifest["spec"]["containers"][0]["volumeMounts"] = [{"name": "gpu", "mountPath": "/dev/nvidia1"}]
    seen, _ = run_probe(stack, manifest)
    assert seen == {"nvidia1": (f"{gpu_devices.NVIDIA_MAJOR}:1", DENIED)}, seen


def test_a_pod_in_nvidias_device_plugin_namespace_keeps_the_env_its_image_and_its_spec_both_set(stack: RealCluster):
    """Issue 44: NVIDIA's standalone device plugin installs into `nvidia-device-plugin`, and its image and its
    DaemonSet both set NVIDIA_VISIBLE_DEVICES=all (the runtime holds both entries). There, such a pod runs with the
    env it asked for (read under runc) and, under NVIDIA's runtime, every GPU; the same pod in a tenant's namespace
    is refused (GPUEnvDuplicated), which is what the default did to NVIDIA's plugin before."""
    namespace = fresh_namespace(stack, "nvidia-device-plugin")
    asked = {"NVIDIA_VISIBLE_DEVICES": "all"}
    # under runc the env is what the kubelet and gpufrac's plugin left (NVIDIA's runtime appends its own `void`
    # after injecting the devices): untouched
    _, env = run_probe(stack, probe_pod(unique("nvdp"), namespace, env=asked))
    assert env == "all"
    seen, _ = run_probe(stack, probe_pod(unique("nvdp"), namespace, env=asked,
                                         runtime_class=nvidia_toolkit.RUNTIME_HANDLER))
    assert_exactly_gpus(seen, len(GPU_UUIDS))
    tenant = fresh_namespace(stack, unique("tenant"))
    _, refused = run_probe(stack, probe_pod(unique("nvdp"), tenant, env=asked,
                                            runtime_class=nvidia_toolkit.RUNTIME_HANDLER), refusal_ok=True)
    assert refused == REFUSED


# ---- a pre-r615 driver -----------------------------------------------------------------------------------------

GPUFRAC_READY = "gpufrac.io/Ready"


def node_conditions(node: RealCluster) -> dict[str, dict]:
    return {c["type"]: c for c in get_json(node, "get", "node", NODE_NAME)["status"]["conditions"]}


def node_labels(node: RealCluster) -> dict[str, str]:
    return dict(get_json(node, "get", "node", NODE_NAME)["metadata"]["labels"])


def node_check_in_the_agent(node: RealCluster) -> tuple[int, dict]:
    """`gpufrac node-check --json` run where a person would run it: in the agent's container on the node, given the
    agent's own --mps-binary (here the fake's path; on a GPU node NVIDIA's runtime puts it on PATH)."""
    [agent] = release_pods(node, "agent")
    container = agent["spec"]["containers"][0]
    args = container.get("args") or []
    binary = args[args.index("--mps-binary") + 1:][:1] if "--mps-binary" in args else []
    res = node.kubectl("exec", "-n", RELEASE_NAMESPACE, agent["metadata"]["name"], "-c", container["name"], "--",
                       "gpufrac", "node-check", "--json", *(["--mps-binary", *binary] if binary else []),
                       user="admin")
    return res.rc, json.loads(res.stdout)


def test_a_580_driver_node_stays_ready_for_kai_and_runs_sm_sharing_fractions(stack: RealCluster):
    """The fake NVML says 580.95.05 (CUDA 13.0: no CUDA 13.4 memory limits), live: the agent reads it on its next
    tick. time-slicing cannot be enforced there and is said so; sm-sharing (MPS's pinned limits) still is, so the node
    stays Ready for KAI and a sm-sharing fraction runs there with its limits. 615.20 is put back after."""
    state = stack.gpu_state()
    state.set(driver_version="580.95.05", cuda_driver_version=13000)
    name = unique("inference-580")
    try:
        ready = wait_until(lambda: (c := node_conditions(stack).get(GPUFRAC_READY)) and
                           c["reason"] == "DriverWithoutMemoryLimits" and c, 120, "the agent to read the 580 driver")
        assert ready["status"] == "True", ready
        assert "580.95.05" in ready["message"] and "time-slicing" in ready["message"], ready
        conditions = node_conditions(stack)
        assert {t: conditions[t]["status"] for t in KAI_CONDITIONS} == dict.fromkeys(KAI_CONDITIONS, "True")
        labels = wait_until(lambda: (ls := node_labels(stack))["gpufrac.io/enforcement.time-slicing"] == "none" and ls,
                            60, "time-slicing labelled not enforced")
        assert labels["gpufrac.io/enforcement.sm-sharing"] == "mps", labels

        rc, report = node_check_in_the_agent(stack)
        verdicts = {v["mode"]: v for v in report["modes"]}
        assert rc == 1 and not report["ok"], report
        assert verdicts["sm-sharing"]["enforceable"] and not verdicts["time-slicing"]["enforceable"], verdicts
        assert any("580.95.05" in why for why in verdicts["time-slicing"]["whyNot"]), verdicts

        manifest = example(SEED_EXAMPLES["inference"][0], name)
        manifest["spec"]["terminationGracePeriodSeconds"] = 1
        res = create_as(stack, manifest)
        assert res.rc == 0, res.stderr  # admitted
        bind(stack, name, SEED_BINDS["inference"])
        wait_running(stack, name, timeout=180)
        out = exec_in(stack, name, gpu_devices.PROBE_COMMAND + "; env")
        assert_exactly_gpus(gpu_devices.parse_probe(out), len(GPU_UUIDS))
        env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line and not line.startswith("DEV "))
        assert {k: env.get(k) for k in SEED_ENV["inference"]} == SEED_ENV["inference"], env
    finally:
        stack.kubectl("delete", "pod", "-n", USER_NAMESPACE, name, "--wait=false", user="admin")
        state.set(driver_version="615.20", cuda_driver_version=13040)
        wait_until(lambda: node_conditions(stack)[GPUFRAC_READY]["reason"] == "FractionsEnforced", 180,
                   "the node back on 615.20, every mode enforced")
