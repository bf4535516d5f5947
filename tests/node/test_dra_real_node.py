"""Issue 48 on the real node: the DRA driver gpu.gpufrac.io as the chart ships it (`dra.enabled=true` on the release
installed with values-local.yaml), the agent's DaemonSet pod registered with the real kubelet 1.36.3, its slices
read by the real kube-scheduler, its claims' CDI specs applied by the real containerd, its sm-sharing claims held by
the agent's MPS daemon (the fake, MPS v3) in a namespace of their own. The GPUs are the node's fake H200s.

Each check fails when its feature is gone: a spec written where containerd does not read leaves the pods failing
(issue 48's item 5), an sm-sharing claim mounted the daemon's directory lists the daemon's entries, a second pod of a
time-slicing claim would run with the claim's limit again, and an agent that does not write a removed spec again
leaves the restarted container failing."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from e2e.agent_on_node import MPS_ROOT
from e2e.install import Helm
from e2e.names import USER_NAMESPACE
from e2e.node import APP_IMAGE, RealCluster
from e2e.pods import events, exec_in, get_json, get_pod, release_pods, wait_running
from e2e.testing import unique
from e2e.toolkit.wait import wait_until
from gpufrac.agent.decide.mps_namespaces import claim_namespace_name
from gpufrac.agent.dra.decide.prepare import spec_file_name
from gpufrac.agent.dra.decide.slices import DRIVER

pytestmark = [pytest.mark.e2e, pytest.mark.real_node]

ENV = "echo LIMIT=$NVIDIA_GPU_MEMORY_LIMIT THREADS=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
# PID 1 that exits on SIGTERM (a shell as PID 1 ignores it otherwise): the test restarts the container with it
COMMAND = ["sh", "-c", "trap 'exit 1' TERM; while sleep 1; do :; done"]


@pytest.fixture(scope="module")
def dra(node: RealCluster, installed: Helm) -> Iterator[Helm]:
    installed.upgrade("dra.enabled=true", "dra.defaultFrontDoor=dra")

    def published() -> bool:
        found = get_json(node, "get", "resourceslices", "--field-selector", f"spec.driver={DRIVER}")["items"]
        return any(s["spec"].get("devices") for s in found)

    try:
        wait_until(published, 180, "the chart's agent publishing its slices", interval=1)
        yield installed
    finally:
        installed.upgrade("dra.enabled=false")


def claim(name: str, device_class: str, memory: str, compute: str | None = None) -> dict:
    requests = {"memory": memory, **({"compute": compute} if compute else {})}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": USER_NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": device_class, "capacity": {"requests": requests}}}]}}}


def pod(name: str, claim_name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": USER_NAMESPACE},
            "spec": {"terminationGracePeriodSeconds": 1,
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
                     "containers": [{"name": "app", "image": APP_IMAGE, "command": COMMAND,
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def create(node: RealCluster, *objs: dict) -> None:
    node.kubectl("create", "-f", "-", user="admin", check=True,
                 input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)}))


def delete(node: RealCluster, pods: list[str], claims: list[str]) -> None:
    for kind, names in (("pod", pods), ("resourceclaim", claims)):
        if names:
            node.kubectl("delete", kind, *names, "-n", USER_NAMESPACE, "--wait=true", "--timeout=90s", user="admin")


def claim_uid(node: RealCluster, name: str) -> str:
    return str(get_json(node, "get", "resourceclaim", name, "-n", USER_NAMESPACE)["metadata"]["uid"])


def test_claim_pods_of_both_modes_run_and_an_sm_sharing_claim_has_its_own_namespace(node: RealCluster, dra: Helm):
    ts, sm = unique("dra-ts"), unique("dra-sm")
    create(node, claim(ts, "time-slicing.gpu.gpufrac.io", "20Gi"), pod(ts, ts),
           claim(sm, "sm-sharing.gpu.gpufrac.io", "10Gi", compute="30"), pod(sm, sm))
    try:
        for name in (ts, sm):
            wait_running(node, name, timeout=180)
        # one mode per GPU: the allocator put them on different GPUs (the shared `owner` counter)
        devices = [get_json(node, "get", "resourceclaim", n, "-n", USER_NAMESPACE)["status"]["allocation"]["devices"]
                   ["results"][0]["device"] for n in (ts, sm)]
        assert devices[0].endswith("-time-slicing") and devices[1].endswith("-sm-sharing"), devices
        assert devices[0].split("-")[1] != devices[1].split("-")[1], devices
        assert exec_in(node, ts, ENV).split() == ["LIMIT=20480", "THREADS="]
        assert exec_in(node, sm, ENV).split() == ["LIMIT=10240", "THREADS=30"]
        # its pipe directory is its claim's MPS namespace: one socket, the namespace's limit; not the daemon's
        namespace = MPS_ROOT / "sm-sharing" / "gpufrac" / claim_namespace_name(USER_NAMESPACE, f"{sm}/gpu")
        out = exec_in(node, sm, 'cd "$CUDA_MPS_PIPE_DIRECTORY" && ls -a && cat fake-server-limits').split()
        assert namespace.is_dir(), f"no namespace directory {namespace} on the host"
        assert sorted(out[:-2]) == [".", "..", "control", "fake-context-share", "fake-server-limits"], out
        assert out[-2:] == ["*", "10240"], out
    finally:
        delete(node, [ts, sm], [ts, sm])


def test_two_pods_of_one_claim_never_run_with_twice_its_limit(node: RealCluster, dra: Helm):
    ts, first, second = unique("dra-shared"), unique("dra-first"), unique("dra-second")
    sm, sm_pods = unique("dra-sm-shared"), [unique("dra-sm-a"), unique("dra-sm-b")]
    create(node, claim(ts, "time-slicing.gpu.gpufrac.io", "20Gi"), pod(first, ts),
           claim(sm, "sm-sharing.gpu.gpufrac.io", "8Gi", compute="20"), *(pod(p, sm) for p in sm_pods))
    try:
        wait_running(node, first, timeout=180)
        create(node, pod(second, ts))
        # an sm-sharing claim's pods share its one MPS namespace: the claim's limit, held once for both
        for name in sm_pods:
            wait_running(node, name, timeout=180)
        seen = [exec_in(node, p, 'cd "$CUDA_MPS_PIPE_DIRECTORY" && cat fake-server-limits').split() for p in sm_pods]
        assert seen == [["*", "8192"], ["*", "8192"]], seen
        namespaces = MPS_ROOT / "sm-sharing" / "gpufrac"
        assert (namespaces / claim_namespace_name(USER_NAMESPACE, f"{sm}/gpu")).is_dir()

        def refused() -> str | None:
            found = [e.get("message", "") for e in events(node, second) if e.get("reason") == "GPUClaimShared"]
            return found[0] if found else None

        message = wait_until(refused, 120, f"pod {second}'s container refused", interval=1)
        assert message is not None and "ResourceClaimTemplate" in message, message
        assert get_pod(node, second)["status"].get("phase") != "Running"
        assert get_pod(node, first)["status"]["phase"] == "Running"
    finally:
        delete(node, [first, second, *sm_pods], [ts, sm])


def test_the_agent_restarted_with_the_claims_specs_removed_brings_a_claims_pod_back(node: RealCluster, dra: Helm):
    name = unique("dra-reboot")
    create(node, claim(name, "time-slicing.gpu.gpufrac.io", "10Gi"), pod(name, name))
    try:
        wait_running(node, name, timeout=180)
        spec = node.cdi_dir / spec_file_name(claim_uid(node, name))
        assert spec.is_file(), f"the claim's spec is not where containerd reads ({node.cdi_dir})"
        [agent] = release_pods(node, "agent")
        spec.unlink()  # as a reboot clears /var/run/cdi, and the agent with it
        node.kubectl("delete", "pod", agent["metadata"]["name"], "-n", agent["metadata"]["namespace"],
                     "--wait=true", user="admin", check=True)
        exec_in(node, name, "kill -TERM 1 || true")  # its container created again: its CDI device is needed again

        def back() -> bool:
            status = get_pod(node, name)["status"]["containerStatuses"][0]
            return status["restartCount"] >= 1 and "running" in status["state"]

        wait_until(back, 240, f"pod {name}'s container running again", interval=1)
        assert spec.is_file() and exec_in(node, name, ENV).split() == ["LIMIT=10240", "THREADS="]
    finally:
        delete(node, [name], [name])
