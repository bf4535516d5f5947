"""Issue 20 on the real node: containerd 2 with NRI and CDI, fake GPU device nodes with NVIDIA-shaped CDI specs,
and the agent's NRI plugin deciding each container's devices at creation. There is no NVIDIA runtime here, so an
env var gives nothing: what a container sees under /dev is what the plugin (through containerd) handed it.

Runs against the session's real node and release (tests/node/conftest.py). Every test leaves the release as it
found it: the agent Ready, its plugin registered, both webhook configurations in place.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from e2e.agent_on_node import MPS_ROOT
from e2e.agent_world import metric_value
from e2e.install import Helm
from e2e.names import NODE_NAME, RELEASE_NAMESPACE, USER_NAMESPACE
from e2e.node import APP_IMAGE, GPU_UUIDS, RealCluster
from e2e.pods import agent_metrics, bind, create, events, exec_in, get_json, get_pod, release_pods, wait_running
from e2e.testing import example, unique
from e2e.toolkit import gpu_devices
from e2e.toolkit.wait import wait_until
from gpufrac.agent.decide.mps_namespaces import namespace_name

pytestmark = [pytest.mark.e2e, pytest.mark.real_node]

AGENT_DS = "gpufrac-agent"
CONTROL_DEVICES = set(gpu_devices.CONTROL_DEVICES)  # the generated spec's control devices
NV = "nvidia.com/container.app."
# Its NVIDIA device nodes, one per line, and the env the checks read.
LIST = ("ls /dev | grep '^nvidia' || true; echo ENV NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES; "
        "echo ENV NVIDIA_GPU_MEMORY_LIMIT=$NVIDIA_GPU_MEMORY_LIMIT; "
        "echo ENV NVIDIA_GPU_MEMORY_REQUEST=$NVIDIA_GPU_MEMORY_REQUEST; "
        "echo ENV CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")


def inside(node: RealCluster, name: str, container: str = "app") -> tuple[set[str], dict[str, str]]:
    """(the container's /dev/nvidia* names, the env the listing printed)."""
    out = exec_in(node, name, LIST, container=container)
    devices = {line.strip() for line in out.splitlines() if line.strip() and not line.startswith("ENV ")}
    env = dict(line[4:].split("=", 1) for line in out.splitlines() if line.startswith("ENV "))
    return devices, env


def plugin_registered(node: RealCluster) -> bool:
    try:
        return metric_value(agent_metrics(node), "gpufrac_nri_plugin_state", state="registered") == 1
    except Exception:
        return False


def refused_outcomes(node: RealCluster) -> float:
    return metric_value(agent_metrics(node), "gpufrac_nri_containers_total", outcome="refused") or 0.0


def agent_event(node: RealCluster, name: str, reason: str) -> dict | None:
    return next((e for e in events(node, name) if e["reason"] == reason
                 and e.get("source", {}).get("component") == "gpufrac-agent"), None)


def kubelet_failure(node: RealCluster, name: str, text: str) -> str | None:
    """The kubelet's event for a container the runtime failed to create (it quotes the runtime's error)."""
    return next((e["message"] for e in events(node, name) if e["reason"] == "Failed" and text in e["message"]), None)


def delete(node: RealCluster, *names: str) -> None:
    node.kubectl("delete", "pod", "-n", USER_NAMESPACE, "--wait=false", "--grace-period=0", "--force", *names,
                 user="admin")


def gone(node: RealCluster, name: str) -> bool:
    return node.kubectl("get", "pod", name, "-n", USER_NAMESPACE, user="admin").rc != 0


def inference_on_one_gpu(name: str, *, sidecar: bool = True) -> dict:
    """The seed's inference pod on one GPU (sm-sharing, 40Gi guaranteed, 60Gi limit), with a second container
    that is no fraction."""
    manifest = example("inference-sm-sharing.yaml", name)
    manifest["metadata"]["annotations"]["gpu-fraction-num-devices"] = "1"
    manifest["spec"]["terminationGracePeriodSeconds"] = 1
    if sidecar:
        manifest["spec"]["containers"].append({"name": "sidecar", "image": APP_IMAGE,
                                               "command": ["sleep", "infinity"]})
    return manifest


def fraction_pod(name: str, mode: str) -> dict:
    manifest = example("inference-sm-sharing.yaml", name)
    manifest["metadata"]["annotations"] = {NV + "gpu-memory.request": "10Gi", NV + "gpu-compute.mode": mode}
    manifest["spec"]["terminationGracePeriodSeconds"] = 1
    return manifest


def start_bound(node: RealCluster, manifest: dict, devices: str) -> dict:
    name = manifest["metadata"]["name"]
    res = create(node, manifest)
    assert res.rc == 0, res.stderr
    bind(node, name, {NV + "gpus.devices": devices})
    return wait_running(node, name)


@pytest.fixture(scope="module")
def with_nri(node: RealCluster, installed: Helm) -> Helm:
    """The release's agent runs its NRI plugin, registered with the node's containerd."""
    if not hasattr(node, "nri_socket"):
        pytest.skip("this real node's containerd has no NRI (the harness before containerd 2)")
    agent = get_json(node, "get", "daemonset", AGENT_DS, "-n", RELEASE_NAMESPACE)
    if "--nri" not in agent["spec"]["template"]["spec"]["containers"][0]["args"]:
        pytest.skip("the release runs its agent without the NRI plugin (values-local.yaml nri.enabled)")
    wait_until(lambda: plugin_registered(node), 180, "the agent's NRI plugin registered", interval=1)
    return installed


@pytest.fixture
def after_each(node: RealCluster, with_nri: Helm) -> Iterator[Helm]:
    yield with_nri
    # A failed test leaves its pod: gone before the next test, or its GPU still serves its mode to later ones.
    left = [p["metadata"]["name"] for p in get_json(node, "get", "pods", "-n", USER_NAMESPACE)["items"]
            if p["metadata"]["name"].startswith("nri-")]
    if left:
        delete(node, *left)
        wait_until(lambda: all(gone(node, name) for name in left), 120, f"pods {left} gone", interval=1)
    wait_until(lambda: plugin_registered(node), 180, "the NRI plugin registered again", interval=1)


# ---- what a container gets -----------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["uuid", "cdi-name"])
def test_the_seed_inference_pod_sees_exactly_its_gpu_and_its_sidecar_none(node: RealCluster, after_each,
                                                                           spelling: str):
    name = unique(f"nri-inference-{spelling}")
    devices = GPU_UUIDS[1] if spelling == "uuid" else f"k8s.device-plugin.nvidia.com/gpu={GPU_UUIDS[1]}"
    start_bound(node, inference_on_one_gpu(name), devices)
    seen, env = inside(node, name)
    assert seen == {"nvidia1", *CONTROL_DEVICES}, seen
    assert env["NVIDIA_GPU_MEMORY_REQUEST"] == "40960" and env["NVIDIA_GPU_MEMORY_LIMIT"] == "61440", env
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{GPU_UUIDS[1]}=61440M", env  # by UUID, not by index
    # the CDI spec NVIDIA's toolkit writes sets it, so that a legacy hook would not inject the GPU again
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void", env
    sidecar, sidecar_env = inside(node, name, container="sidecar")
    assert sidecar == set(), sidecar
    assert sidecar_env["NVIDIA_VISIBLE_DEVICES"] == "void", sidecar_env
    delete(node, name)


def test_an_sm_sharing_fractions_pipe_directory_is_its_own_mps_namespace(node: RealCluster, after_each):
    """Issue 30 on the real node (r615 fake driver, MPS v3): containerd mounts, at the fraction's
    CUDA_MPS_PIPE_DIRECTORY, the directory of the MPS namespace the agent made for it, holding its own limit; the
    daemon's control socket and the other namespaces are not in the container."""
    name = unique("nri-namespace")
    pod = start_bound(node, inference_on_one_gpu(name, sidecar=False), GPU_UUIDS[3])
    namespace = MPS_ROOT / "sm-sharing" / "gpufrac" / namespace_name(pod["metadata"]["uid"], "app")
    try:
        out = exec_in(node, name, 'cd "$CUDA_MPS_PIPE_DIRECTORY" && ls -a && cat fake-server-limits')
        assert namespace.is_dir(), f"no namespace directory {namespace} on the host"
    finally:
        delete(node, name)
    lines = out.split()
    assert sorted(lines[:-2]) == [".", "..", "control", "fake-context-share", "fake-server-limits"], out
    assert lines[-2:] == ["*", "61440"], out  # its own limit, the namespace's
    wait_until(lambda: not namespace.exists(), 120, "its namespace deleted with its pod", interval=1)


def test_a_plain_pod_of_a_cuda_image_gets_none(node: RealCluster, after_each):
    """The CUDA base image's own NVIDIA_VISIBLE_DEVICES=all (its ENV) is voided."""
    name = unique("nri-plain-all")
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": USER_NAMESPACE},
                "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                    "name": "app", "image": APP_IMAGE, "command": ["sleep", "infinity"]}]}}
    res = create(node, manifest)
    assert res.rc == 0, res.stderr
    wait_running(node, name)
    seen, env = inside(node, name)
    assert seen == set(), seen
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void", "the plugin voided the grant"
    delete(node, name)


def test_a_plain_pod_naming_every_gpu_again_in_its_env_is_refused(node: RealCluster, after_each):
    """The pod's env names NVIDIA_VISIBLE_DEVICES=all over the image's: the container would hold the name twice and
    NVIDIA's runtime reads the last entry, past gpufrac's void: the creation is refused instead."""
    name = unique("nri-plain-all-again")
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": USER_NAMESPACE},
                "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                    "name": "app", "image": APP_IMAGE, "command": ["sleep", "infinity"],
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}
    res = create(node, manifest)
    assert res.rc == 0, res.stderr
    try:
        message = wait_until(lambda: kubelet_failure(node, name, "NVIDIA_VISIBLE_DEVICES more than once"), 120,
                             f"pod {name}'s creation refused", interval=0.5)
    finally:
        delete(node, name)
    assert "failed to get NRI adjustment" in message, message  # the NRI plugin refused it, not something else


@pytest.fixture
def webhooks_deleted(node: RealCluster) -> Iterator[None]:
    """The release's admission (both webhook configurations, and any ValidatingAdmissionPolicy binding) deleted, as
    a bypass would have it; put back as it was afterwards."""
    kept = []
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration",
                 "validatingadmissionpolicybinding"):
        res = node.kubectl("get", kind, "-l", "app.kubernetes.io/instance=gpufrac", "-o", "json", user="admin")
        for item in json.loads(res.stdout)["items"] if res.rc == 0 else []:
            kept.append(item)
            assert node.kubectl("delete", kind, item["metadata"]["name"], user="admin").rc == 0
    assert kept, "no webhook configuration of the release found"
    # The API server drops a deleted policy binding from its admission cache a moment later: wait until a forged
    # pod passes a dry run (the policy gpufrac-pods refuses it while its binding is still cached).
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "forged-probe", "namespace": USER_NAMESPACE, "annotations": {NV + "gpus.devices": GPU_UUIDS[1]}},
        "spec": {"containers": [{"name": "app", "image": APP_IMAGE}]}}
    wait_until(lambda: node.kubectl("create", "--dry-run=server", "-f", "-", user="alice",
                                    input=json.dumps(probe)).rc == 0,
               30, "admission without the release's policy binding", interval=0.5)
    yield
    for item in kept:
        for field in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
            item["metadata"].pop(field, None)
        res = node.kubectl("create", "-f", "-", user="admin", input=json.dumps(item))
        assert res.rc == 0, res.stderr


def _waiting_reason(node: RealCluster, name: str) -> str | None:
    statuses = get_pod(node, name)["status"].get("containerStatuses") or []
    return statuses[0]["state"].get("waiting", {}).get("reason") if statuses else None


def test_a_forged_gpus_devices_without_the_webhook_is_refused_at_creation(node: RealCluster, after_each,
                                                                          webhooks_deleted):
    name = unique("nri-forged")
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": USER_NAMESPACE, "annotations": {NV + "gpus.devices": GPU_UUIDS[1]}},
        "spec": {"nodeName": NODE_NAME, "terminationGracePeriodSeconds": 1, "containers": [{
            "name": "app", "image": APP_IMAGE, "command": ["sleep", "infinity"],
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": GPU_UUIDS[1]}]}]}}
    before = refused_outcomes(node)
    res = create(node, manifest)
    assert res.rc == 0, res.stderr  # no webhook: the API server admits it
    event = wait_until(lambda: agent_event(node, name, "GPUFractionNotAdmitted"), 120,
                       "the agent's Warning Event", interval=1)
    print(event["message"])
    assert event["type"] == "Warning"
    assert f"{NV}gpus.devices" in event["message"] and "the webhook did not admit it" in event["message"]
    failure = wait_until(lambda: kubelet_failure(node, name, "GPUFractionNotAdmitted") or
                         kubelet_failure(node, name, "did not admit it"), 60, "the kubelet's CreateContainerError",
                         interval=1)
    print(failure)
    assert "code = FailedPrecondition" in failure, failure
    # The kubelet logs the failure before it writes the pod's status: wait for the status too (it once lagged).
    wait_until(lambda: _waiting_reason(node, name) == "CreateContainerError", 60,
               f"pod {name}'s container to wait on CreateContainerError", interval=0.5)
    assert refused_outcomes(node) > before
    delete(node, name)


# ---- one GPU, two modes --------------------------------------------------------------------------------------


def test_two_pods_on_one_gpu_share_it_in_one_mode_and_not_across_modes(node: RealCluster, after_each):
    gpu = GPU_UUIDS[2]
    first, same, other = unique("nri-ts-a"), unique("nri-ts-b"), unique("nri-sm")
    start_bound(node, fraction_pod(first, "time-slicing"), gpu)
    start_bound(node, fraction_pod(same, "time-slicing"), gpu)
    assert inside(node, same)[0] == {"nvidia2", *CONTROL_DEVICES}
    res = create(node, fraction_pod(other, "sm-sharing"))
    assert res.rc == 0, res.stderr
    bind(node, other, {NV + "gpus.devices": gpu})
    event = wait_until(lambda: agent_event(node, other, "GPUServesOtherMode"), 120, "the refusal's Event", interval=1)
    print(event["message"])
    assert f"GPU {gpu} serves time-slicing to container app of pod {USER_NAMESPACE}/" in event["message"]
    assert get_pod(node, other)["status"].get("phase") == "Pending"
    delete(node, first, same)
    wait_until(lambda: gone(node, first) and gone(node, same), 60, "the time-slicing pods gone", interval=1)
    wait_running(node, other, timeout=240)  # the kubelet retries the creation with backoff
    assert inside(node, other)[0] == {"nvidia2", *CONTROL_DEVICES}
    delete(node, other)


# ---- the hard limit (issue 43) --------------------------------------------------------------------------------


def cgroup_limits(node: RealCluster) -> list[tuple[str, int, str]]:
    """What the agent set through the fake NVML: (GPU, hard limit in bytes, cgroup path), in order."""
    path = node.gpu_fakes / "nvml.json.memory-limits"
    rows = [line.split(" ", 3) for line in (path.read_text().splitlines() if path.exists() else [])]
    return [(uuid, int(hard), where) for uuid, hard, _soft, where in rows]


def test_a_running_time_slicing_fractions_cgroup_limit_is_its_limit(node: RealCluster, after_each):
    """The agent sets the fraction's limit on its own cgroup through NVML and reads it back; the fake NVML's record
    equals the limit the fraction carries, and the time-slicing boundary is labelled hard only with it set."""
    gpu, name = GPU_UUIDS[1], unique("nri-hard")
    pod = start_bound(node, fraction_pod(name, "time-slicing"), gpu)
    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://")[-1]
    limit_mib = int(inside(node, name)[1]["NVIDIA_GPU_MEMORY_LIMIT"])
    held = wait_until(lambda: [hard for uuid, hard, where in cgroup_limits(node)
                               if uuid == gpu and container_id in where], 60, "the limit on its cgroup", interval=1)
    assert held[-1] == limit_mib << 20, (held, limit_mib)
    labels = get_json(node, "get", "node", NODE_NAME)["metadata"]["labels"]
    assert labels.get("gpufrac.io/boundary.time-slicing") == "hard", labels
    delete(node, name)



def boundary_labels(node: RealCluster) -> dict[str, str]:
    labels = get_json(node, "get", "node", NODE_NAME)["metadata"]["labels"]
    return {key: value for key, value in labels.items() if key.startswith("gpufrac.io/boundary.")}


def readiness(node: RealCluster) -> dict:
    conditions = get_json(node, "get", "node", NODE_NAME)["status"].get("conditions") or []
    return next((c for c in conditions if c["type"] == "gpufrac.io/Ready"), {})


def refuse_cgroup_v1(node: RealCluster, refused: bool) -> None:
    """The node's "driver" refuses a cgroup v1 path as NVIDIA's does (the fake NVML's switch, in the agent's env)."""
    setting = "GPUFRAC_FAKE_NVML_REFUSE_CGROUP_V1=1" if refused else "GPUFRAC_FAKE_NVML_REFUSE_CGROUP_V1-"
    res = node.kubectl("set", "env", f"daemonset/{AGENT_DS}", "-n", RELEASE_NAMESPACE, setting, user="admin")
    assert res.rc == 0, res.stderr


def enforcement_labels(node: RealCluster) -> dict[str, str]:
    labels = get_json(node, "get", "node", NODE_NAME)["metadata"]["labels"]
    return {key: value for key, value in labels.items() if key.startswith("gpufrac.io/enforcement.")}


def test_where_the_driver_holds_no_cgroup_limit_no_mode_is_labelled_driver_nor_hard(node: RealCluster, after_each):
    """NVIDIA's driver holds no limit on a cgroup v1 path (the fake NVML's switch, as the real driver refuses one):
    the agent's probe finds it, so time-slicing, whose one driver limit that is, is labelled enforced `none` and its
    boundary `none`, sm-sharing `mps` and `cooperative`, and the condition says why; with the driver able again,
    `driver` and `hard` come back."""
    refuse_cgroup_v1(node, True)
    try:
        wait_until(lambda: boundary_labels(node) == {"gpufrac.io/boundary.time-slicing": "none",
                                                     "gpufrac.io/boundary.sm-sharing": "cooperative"},
                   180, "the boundaries of a driver without cgroup limits", interval=1)
        assert enforcement_labels(node) == {"gpufrac.io/enforcement.time-slicing": "none",
                                            "gpufrac.io/enforcement.sm-sharing": "mps"}
        said = readiness(node)
        assert said["status"] == "True" and "the driver holds no memory limit on a container's cgroup here" in \
            said["message"], said
        wait_until(lambda: plugin_registered(node), 180, "the restarted agent's plugin registered", interval=1)
    finally:
        refuse_cgroup_v1(node, False)
    wait_until(lambda: enforcement_labels(node).get("gpufrac.io/enforcement.time-slicing") == "driver" and
               boundary_labels(node).get("gpufrac.io/boundary.time-slicing") == "hard", 180,
               "driver and hard back", interval=1)


# ---- the agent away ------------------------------------------------------------------------------------------


def agent_away(node: RealCluster, away: bool) -> None:
    selector = {"gpufrac.io/e2e-agent-away": "true" if away else None}
    res = node.kubectl("patch", "daemonset", AGENT_DS, "-n", RELEASE_NAMESPACE, "--type=merge", "-p",
                       json.dumps({"spec": {"template": {"spec": {"nodeSelector": selector}}}}), user="admin")
    assert res.rc == 0, res.stderr


def test_with_the_agent_stopped_no_container_gets_a_gpu_without_limits(node: RealCluster, after_each):
    running = unique("nri-running")
    start_bound(node, inference_on_one_gpu(running, sidecar=False), GPU_UUIDS[3])
    new, plain = unique("nri-while-away"), unique("nri-plain-away")
    agent_away(node, True)
    try:
        wait_until(lambda: not release_pods(node, "agent"), 120, "the agent pod to go", interval=1)
        # a running container keeps its devices
        assert inside(node, running)[0] == {"nvidia3", *CONTROL_DEVICES}
        # a new fractional pod does not start: its MPS volume needs the agent's CSI driver, so the kubelet never
        # gets to creating its container (and with required_plugins containerd would refuse it)
        res = create(node, inference_on_one_gpu(new, sidecar=False))
        assert res.rc == 0, res.stderr
        bind(node, new, {NV + "gpus.devices": GPU_UUIDS[3]})
        # a plain pod starts (NRI fails open), its env not voided, and no device: nothing here grants by env
        manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": plain, "namespace": USER_NAMESPACE},
                    "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                        "name": "app", "image": APP_IMAGE, "command": ["sleep", "infinity"],
                        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}
        assert create(node, manifest).rc == 0
        wait_running(node, plain)
        seen, env = inside(node, plain)
        assert seen == set() and env["NVIDIA_VISIBLE_DEVICES"] == "all", (seen, env)
        p = get_pod(node, new)
        assert p["status"].get("phase") == "Pending", p["status"]
        assert not [s for s in p["status"].get("containerStatuses") or [] if "running" in s.get("state", {})]
    finally:
        agent_away(node, False)
    wait_until(lambda: plugin_registered(node), 180, "the agent back, its plugin registered", interval=1)
    wait_running(node, new, timeout=240)
    assert inside(node, new)[0] == {"nvidia3", *CONTROL_DEVICES}, "creation works again, with the plugin"
    # the plain container that asked for every GPU while the plugin was away is found and stopped (issue 43)
    swept = wait_until(lambda: agent_event(node, plain, "GPUCreatedWithoutPlugin"), 120, "the plain pod swept",
                       interval=1)
    assert "is no GPU fraction" in swept["message"] and "so the plugin stopped it" in swept["message"], swept
    delete(node, running, new, plain)


# ---- limits the tenant writes itself (docs/security.md, rows 1 and 6) -------------------------------------------

# What a tenant would write to lift its fraction's limits: every GPU's memory, every SM.
OWN_LIMITS = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=143771M", "NVIDIA_GPU_MEMORY_LIMIT": "143771",
              "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}
PRINT_ENVIRON = "tr '\\0' '\\n' < /proc/1/environ"


def environ_entries(node: RealCluster, name: str) -> list[tuple[str, str]]:
    """The container's first process's env, every entry (a name the runtime holds twice shows twice)."""
    out = exec_in(node, name, PRINT_ENVIRON)
    return [(key, value) for key, sep, value in map(lambda line: line.partition("="), out.splitlines()) if sep]


@pytest.mark.parametrize("written_in", ["env", "envFrom"])
def test_a_fraction_that_writes_its_own_limits_runs_with_gpufracs(node: RealCluster, after_each, written_in: str):
    """The sm-sharing fraction's own container asks for the whole GPU in `env` (the webhook replaces its entries) or
    through `envFrom` a ConfigMap (the webhook cannot read it; the kubelet lets `env` win): inside, each name once,
    with gpufrac's value, the pinned limit keyed by the bound GPU's UUID."""
    name = unique(f"nri-own-{written_in.lower()}")
    manifest = inference_on_one_gpu(name, sidecar=False)
    app = manifest["spec"]["containers"][0]
    if written_in == "env":
        app["env"] = [{"name": k, "value": v} for k, v in OWN_LIMITS.items()]
    else:
        config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": USER_NAMESPACE},
                  "data": OWN_LIMITS}
        assert node.kubectl("apply", "-f", "-", user="admin", input=json.dumps(config)).rc == 0
        app["envFrom"] = [{"configMapRef": {"name": name}}]
    res = create(node, manifest)
    assert res.rc == 0, res.stderr
    try:
        bind(node, name, {NV + "gpus.devices": GPU_UUIDS[2], NV + "gpu-compute.portion": "0.25"})
        wait_running(node, name)
        entries = environ_entries(node, name)
    finally:
        delete(node, name)
        node.kubectl("delete", "configmap", name, "-n", USER_NAMESPACE, "--ignore-not-found", user="admin")
    seen = [(k, v) for k, v in entries if k in OWN_LIMITS]
    assert sorted(seen) == sorted([("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", f"{GPU_UUIDS[2]}=61440M"),
                                   ("NVIDIA_GPU_MEMORY_LIMIT", "61440"),
                                   ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25")]), entries


def test_a_name_gpufrac_owns_that_it_did_not_set_is_refused_at_creation(node: RealCluster, after_each):
    """A time-slicing fraction gets no thread percentage from gpufrac: one that arrives by `envFrom` (which the
    webhook cannot read) is refused when the runtime creates the container, naming it."""
    name = unique("nri-own-foreign")
    manifest = fraction_pod(name, "time-slicing")
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": USER_NAMESPACE},
              "data": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}}
    assert node.kubectl("apply", "-f", "-", user="admin", input=json.dumps(config)).rc == 0
    manifest["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": name}}]
    try:
        res = create(node, manifest)
        assert res.rc == 0, res.stderr  # admitted: the webhook cannot see into the ConfigMap
        bind(node, name, {NV + "gpus.devices": GPU_UUIDS[2]})
        message = wait_until(lambda: kubelet_failure(node, name, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), 120,
                             f"pod {name}'s creation refused", interval=0.5)
    finally:
        delete(node, name)
        node.kubectl("delete", "configmap", name, "-n", USER_NAMESPACE, "--ignore-not-found", user="admin")
    assert "failed to get NRI adjustment" in message and "did not set for it" in message, message


def test_a_privileged_fraction_is_denied(node: RealCluster, after_each):
    manifest = inference_on_one_gpu(unique("nri-privileged"), sidecar=False)
    manifest["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    res = create(node, manifest)
    assert res.rc != 0, "a privileged fraction was admitted"
    assert "container app: is privileged" in res.stderr and "securityContext.privileged" in res.stderr, res.stderr
