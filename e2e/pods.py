"""What tests and the demo do with pods on the real node: act as the scheduler's binder, wait for Running,
run a command inside, find a container's processes on the host."""

from __future__ import annotations

import json
import urllib.request

from e2e.kubectl import KubectlResult
from e2e.names import NODE_NAME, RELEASE_NAMESPACE, USER_NAMESPACE
from e2e.node import APP_IMAGE, GPU_UUIDS, RealCluster
from e2e.toolkit.errors import ClusterError
from e2e.toolkit.wait import WaitTimeoutError, wait_until
from gpufrac.core.contract import format_pinned_mem_limit_by_uuid

NV = "nvidia.com/container.app."
# The bind-time annotations KAI's binder writes for the two seed examples on this node's fake H200s.
SEED_BINDS = {
    "inference": {NV + "gpus.devices": ",".join(GPU_UUIDS),
                  NV + "gpu-compute.portion": "0.25"},  # KAI's binder (PR 2368): sm-sharing caps it at 25 %
    "notebook": {NV + "gpus.devices": ",".join(GPU_UUIDS[:2]),
                 NV + "gpu-memory.request": "71885Mi",  # 143771 MiB x 0.5
                 NV + "gpu-memory.limit": "115016Mi"},  # 143771 MiB x 0.8
}
# Each seed's example file, its compute mode, and the env its container must see once bound with SEED_BINDS.
SEED_EXAMPLES = {"inference": ("inference-sm-sharing.yaml", "sm-sharing"),
                 "notebook": ("notebook-time-slicing.yaml", "time-slicing")}
# The pinned limit inside is keyed by the bound GPUs' UUIDs (the NRI plugin rewrites the webhook's index keys).
# NVIDIA_VISIBLE_DEVICES is `void` inside: the agent's NRI plugin hands the GPUs over as CDI devices, whose NVIDIA
# specs set it so that NVIDIA's hook would not inject them again (the webhook's value is the bound UUIDs).
SEED_ENV = {
    "inference": {"NVIDIA_GPU_MEMORY_REQUEST": "40960", "NVIDIA_GPU_MEMORY_LIMIT": "61440",
                  "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": format_pinned_mem_limit_by_uuid(61440, GPU_UUIDS),
                  "NVIDIA_VISIBLE_DEVICES": "void",
                  "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                  "CUDA_MPS_PIPE_DIRECTORY": "/run/gpufrac/mps/sm-sharing"},
    "notebook": {"NVIDIA_GPU_MEMORY_REQUEST": "71885", "NVIDIA_GPU_MEMORY_LIMIT": "115016",
                 "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": format_pinned_mem_limit_by_uuid(115016, GPU_UUIDS[:2]),
                 "NVIDIA_VISIBLE_DEVICES": "void",
                 "CUDA_MPS_PIPE_DIRECTORY": "/run/gpufrac/mps/time-slicing"},
}


def get_json(node: RealCluster, *args: str, user: str = "admin") -> dict:
    res = node.kubectl(*args, "-o", "json", user=user)
    if res.rc != 0:
        raise ClusterError(f"kubectl {' '.join(args)}: {res.stderr.strip()}")
    return json.loads(res.stdout)


def bind(node: RealCluster, name: str, annotations: dict[str, str]) -> None:
    """What KAI's binder does: one merge patch of the bind-time annotations, then POST pods/binding."""
    res = node.kubectl("patch", "pod", name, "--type=merge", "-p",
                       json.dumps({"metadata": {"annotations": annotations}}), user="binder")
    if res.rc != 0:
        raise ClusterError(f"the binder's annotation patch was refused: {res.stderr.strip()}")
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
               "target": {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME}}
    res = node.kubectl("create", "--raw", f"/api/v1/namespaces/{USER_NAMESPACE}/pods/{name}/binding", "-f", "-",
                       input=json.dumps(binding), user="binder")
    if res.rc != 0:
        raise ClusterError(f"the binding was refused: {res.stderr.strip()}")


def get_pod(node: RealCluster, name: str) -> dict:
    return get_json(node, "get", "pod", name, "-n", USER_NAMESPACE)


def wait_running(node: RealCluster, name: str, timeout: float = 120) -> dict:
    def running():
        p = get_pod(node, name)
        return p if p["status"].get("phase") == "Running" else None

    try:
        return wait_until(running, timeout, f"pod {name} Running", interval=0.5)
    except WaitTimeoutError as e:
        try:
            why = why_not_running(node, name)
        except ClusterError as unread:
            why = f"(the pod or node could not be read: {unread})"
        raise WaitTimeoutError(f"{e}: {why}") from None


def why_not_running(node: RealCluster, name: str) -> str:
    return not_running_reasons(get_pod(node, name), get_json(node, "get", "node", NODE_NAME))


def not_running_reasons(pod: dict, found: dict) -> str:
    """The pod's phase, its unmet conditions and waiting containers, and the node's taints and pressures: what a
    timeout needs to say (a node under DiskPressure only shows as pods that stay Pending)."""
    status = pod["status"]
    said = [f"phase {status.get('phase')}"]
    said += [f"{c['type']}={c['status']} ({c.get('reason', '')}: {c.get('message', '')})"
             for c in status.get("conditions", []) if c["status"] != "True"]
    said += [f"container {c['name']} waiting: {c['state']['waiting'].get('reason')} "
             f"{c['state']['waiting'].get('message', '')}".rstrip()
             for c in status.get("containerStatuses", []) if "waiting" in c.get("state", {})]
    said += [f"node taint {t['key']}:{t['effect']}" for t in found["spec"].get("taints", [])]
    said += [f"node {c['type']}: {c.get('message', '')}" for c in found["status"].get("conditions", [])
             if c["type"].endswith("Pressure") and c["status"] == "True"]
    return "; ".join(said)


def exec_in(node: RealCluster, name: str, script: str, container: str = "app") -> str:
    res = node.kubectl("exec", "-n", USER_NAMESPACE, name, "-c", container, "--", "sh", "-c", script, user="admin")
    if res.rc != 0:
        raise ClusterError(f"kubectl exec {name}: {res.stderr.strip()}")
    return res.stdout


def host_pids(node: RealCluster, name: str, container: str = "app") -> list[int]:
    """The host pids of a container's processes (what NVML reports on a real node)."""
    status = next(s for s in get_pod(node, name)["status"]["containerStatuses"] if s["name"] == container)
    res = node.containerd.ctr("tasks", "ps", status["containerID"].removeprefix("containerd://"))
    if res.returncode != 0:
        raise ClusterError(f"ctr tasks ps: {res.stderr.strip()}")
    return [int(line.split()[0]) for line in res.stdout.splitlines()[1:] if line.strip()]


def create(node: RealCluster, obj: dict, user: str = "alice") -> KubectlResult:
    return node.kubectl("create", "-f", "-", user=user, input=json.dumps(obj))


def plain_pod(name: str) -> dict:
    """A pod without any fraction key, for the default scheduler."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": USER_NAMESPACE},
            "spec": {"containers": [{"name": "app", "image": APP_IMAGE, "command": ["sleep", "infinity"]}],
                     "terminationGracePeriodSeconds": 1}}


def events(node: RealCluster, name: str) -> list[dict]:
    """The events about one pod of the tenant namespace."""
    return get_json(node, "get", "events", "-n", USER_NAMESPACE, "--field-selector",
                    f"involvedObject.name={name}")["items"]


def release_pods(node: RealCluster, component: str) -> list[dict]:
    """The release's pods of one component (webhook, agent, mps), terminating ones left out."""
    pods = get_json(node, "get", "pods", "-n", RELEASE_NAMESPACE, "-l",
                    f"app.kubernetes.io/component={component}")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def agent_metrics(node: RealCluster) -> str:
    """The node agent's /metrics, from its pod."""
    [agent] = release_pods(node, "agent")
    port = agent["spec"]["containers"][0]["ports"][0]["containerPort"]
    with urllib.request.urlopen(f"http://{agent['status']['podIP']}:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()
