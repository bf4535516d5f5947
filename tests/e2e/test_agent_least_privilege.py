"""Least privilege, through the real kube-apiserver: the agent's identity (its ServiceAccount, a token bound to an
agent pod on node A, so it carries the `authentication.kubernetes.io/node-name` extra a kubelet-mounted token
carries) writes its own node's Node and ResourceSlices and evicts pods on its node, and is refused the same on
node B. The chart's own RBAC and ValidatingAdmissionPolicies (templates/agent/own-node-policy.yaml) are applied as
`helm template` renders them; no kubelet is needed (Nodes and bound pods are plain API objects). Its reads beside:
the fractional pods no node has and the nodes' labels, cluster-wide, and an Event on such a pod."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from e2e.cluster import ControlPlane
from e2e.kubectl import KubectlResult, as_list, run_kubectl
from e2e.toolkit import pki
from e2e.toolkit.wait import wait_until
from gpufrac.agent.decide.unplaceable_fractions import defaulted_time_slicing, unplaceable, unplaceable_event
from gpufrac.agent.edges.kube import KubeClient
from testkit.chart import CHART, HELM

pytestmark = pytest.mark.e2e

RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
              "ValidatingAdmissionPolicyBinding"}
# DRA on (ResourceSlices) and evictions on (enforcement.overLimitAction evict): every write the agent may make
VALUES = ["--set", "dra.enabled=true", "--set", "enforcement.overLimitAction=evict"]


class Agent:
    def __init__(self, plane: ControlPlane, kubeconfig: Path, ns: str, nodes: tuple[str, str]) -> None:
        self.plane, self.kubeconfig, self.ns, self.nodes = plane, kubeconfig, ns, nodes

    def kubectl(self, *args: str, input: str | None = None) -> KubectlResult:
        return run_kubectl(self.plane.tools.kubectl, self.kubeconfig, *args, user="the agent", input=input)


def admin(plane: ControlPlane, *args: str, input: str | None = None) -> KubectlResult:
    return plane.kubectl(*args, user="admin", input=input, check=True)


def chart_rbac(release: str, ns: str) -> list[dict]:
    out = subprocess.run([str(HELM), "template", release, str(CHART), "--namespace", ns, *VALUES],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return [o for o in yaml.safe_load_all(out) if o and o["kind"] in RBAC_KINDS
            and o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "agent"]


def node(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"test": "least-privilege"}}}


def pod(name: str, ns: str, on: str, sa: str = "default") -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"nodeName": on, "serviceAccountName": sa,
                     "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}


def resource_slice(name: str, on: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": "gpu.gpufrac.io", "nodeName": on,
                     "pool": {"name": on, "generation": 1, "resourceSliceCount": 1}, "devices": []}}


@pytest.fixture
def agent(cluster: ControlPlane, ns: str, tmp_path: Path) -> Iterator[Agent]:
    suffix = ns.rsplit("-", 1)[-1]  # the namespace's random part
    release = f"lp{suffix}"
    nodes = (f"lp-a-{suffix}", f"lp-b-{suffix}")
    objects = chart_rbac(release, ns)
    kinds = {o["kind"] for o in objects}
    assert kinds == RBAC_KINDS, kinds
    (sa,) = [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"]
    admin(cluster, "apply", "-f", "-", input=as_list([node(n) for n in nodes]))
    admin(cluster, "apply", "-f", "-", input=as_list(objects))
    admin(cluster, "apply", "-f", "-",
          input=as_list([pod("agent", ns, nodes[0], sa), pod("work-a", ns, nodes[0]), pod("work-b", ns, nodes[1])]))
    token = admin(cluster, "create", "token", sa, "-n", ns, "--bound-object-kind", "Pod",
                  "--bound-object-name", "agent", "--duration", "10m").stdout.strip()
    kubeconfig = tmp_path / "agent.kubeconfig"
    pki.write_kubeconfig(kubeconfig, cluster.server, cluster.ca_file, "agent", token=token, namespace=ns)
    agent = Agent(cluster, kubeconfig, ns, nodes)
    # the API server loads new policies (and the eviction policy's params) a moment after they are created: wait
    # until a dry run of each write to node B is refused by them
    assert wait_until(lambda: "may write only its own node" in label(agent, nodes[1], "--dry-run=server").stderr,
                      30, "the own-node policy active", interval=0.5)
    assert wait_until(lambda: "may evict only pods on its own node" in evict(agent, "work-b", dry_run=True).stderr,
                      30, "the own-node eviction policy active", interval=0.5)
    yield agent
    cluster.kubectl("delete", "resourceslice", "-l", f"test={suffix}", "--ignore-not-found", user="admin")
    cluster.kubectl("delete", "node", *nodes, "--ignore-not-found", "--wait=false", user="admin")
    cluster.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false", user="admin", input=as_list(objects))


def whoami(agent: Agent) -> dict:
    out = agent.kubectl("auth", "whoami", "-o", "json")
    assert out.rc == 0, out.stderr
    return json.loads(out.stdout)["status"]["userInfo"]


def label(agent: Agent, name: str, *flags: str) -> KubectlResult:
    return agent.kubectl("label", "node", name, "gpufrac.io/least-privilege=1", "--overwrite", *flags)


def test_the_agent_patches_only_its_own_node(agent: Agent) -> None:
    own, other = agent.nodes
    assert whoami(agent)["extra"]["authentication.kubernetes.io/node-name"] == [own]
    assert label(agent, own).rc == 0
    refused = label(agent, other)
    assert refused.rc != 0
    assert f"the gpufrac agent on node {own} may write only its own node's nodes, not those of node {other}" \
        in refused.stderr
    status = agent.kubectl("patch", "node", other, "--subresource=status", "--type=merge",
                           "-p", '{"status":{"conditions":[{"type":"gpufrac.io/Ready","status":"True"}]}}')
    assert status.rc != 0 and "may write only its own node's nodes" in status.stderr
    assert agent.kubectl("delete", "node", other).rc != 0


def test_the_agent_writes_only_its_own_node_s_resource_slices(agent: Agent) -> None:
    own, other = agent.nodes
    suffix = own.rsplit("-", 1)[-1]
    mine, theirs = resource_slice(f"{own}-gpus", own), resource_slice(f"{other}-gpus", other)
    for s in (mine, theirs):
        s["metadata"]["labels"] = {"test": suffix}
    created = agent.kubectl("create", "-f", "-", input=json.dumps(mine))
    assert created.rc == 0, created.stderr
    refused = agent.kubectl("create", "-f", "-", input=json.dumps(theirs))
    assert refused.rc != 0 and f"not those of node {other}" in refused.stderr
    # nor moves its own slice to the other node, nor deletes the other node's slice
    moved = agent.kubectl("patch", "resourceslice", f"{own}-gpus", "--type=merge", "-p",
                          json.dumps({"spec": {"nodeName": other}}))
    assert moved.rc != 0, moved.stdout
    admin(agent.plane, "create", "-f", "-", input=json.dumps(theirs))
    assert agent.kubectl("delete", "resourceslice", f"{other}-gpus").rc != 0
    assert agent.kubectl("delete", "resourceslice", f"{own}-gpus").rc == 0


def evict(agent: Agent, name: str, *, dry_run: bool = False) -> KubectlResult:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": agent.ns}}
    query = "?dryRun=All" if dry_run else ""
    return agent.kubectl("create", "--raw", f"/api/v1/namespaces/{agent.ns}/pods/{name}/eviction{query}", "-f", "-",
                         input=json.dumps(body))


def test_the_agent_evicts_only_pods_on_its_own_node(agent: Agent) -> None:
    other = agent.nodes[1]
    refused = evict(agent, "work-b")
    assert refused.rc != 0
    assert f"may evict only pods on its own node, not pod {agent.ns}/work-b on node {other}" in refused.stderr
    allowed = evict(agent, "work-a")
    assert allowed.rc == 0, allowed.stderr
    pods = admin(agent.plane, "get", "pods", "-n", agent.ns, "-o", "name").stdout.split()
    assert "pod/work-b" in pods


def test_without_a_node_claim_the_agent_s_identity_writes_nothing(cluster: ControlPlane, agent: Agent,
                                                                   tmp_path: Path) -> None:
    """A token of the ServiceAccount not bound to a pod (one an attacker could mint with `create token`) names no
    node: no Node, no ResourceSlice, no eviction."""
    sa = json.loads(agent.kubectl("auth", "whoami", "-o", "json").stdout)["status"]["userInfo"]["username"]
    name = sa.rsplit(":", 1)[-1]
    token = admin(cluster, "create", "token", name, "-n", agent.ns, "--duration", "10m").stdout.strip()
    kubeconfig = tmp_path / "unbound.kubeconfig"
    pki.write_kubeconfig(kubeconfig, cluster.server, cluster.ca_file, "unbound", token=token, namespace=agent.ns)
    unbound = Agent(cluster, kubeconfig, agent.ns, agent.nodes)
    refused = label(unbound, agent.nodes[0])
    assert refused.rc != 0 and "names no node" in refused.stderr
    assert evict(unbound, "work-a").rc != 0


def test_the_agent_may_list_the_pods_no_node_has_and_the_nodes_and_tell_such_a_pod(agent: Agent) -> None:
    """Where no node serves time-slicing, an agent on an old driver lists the fractional pods no node has and the
    nodes' labels, and puts its Event on such a pod (decide/unplaceable_fractions.py), through its real edge and the
    chart's RBAC: reads cluster-wide, the one write an Event."""
    own, other = agent.nodes
    ts = "gpufrac.io/enforcement.time-slicing"
    admin(agent.plane, "label", "node", own, other, f"{ts}=none", "--overwrite")
    waiting = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "waiting", "namespace": agent.ns, "labels": {"gpufrac.io/fractional": "true"},
        "annotations": {"gpu-fraction": "0.5", "gpufrac.io/container.c.compute-mode": "time-slicing"}},
        # what the webhook's affinity asks, as a selector no node meets: it stays unbound
        "spec": {"nodeSelector": {ts: "driver"}, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}
    admin(agent.plane, "create", "-f", "-", input=json.dumps(waiting))
    kube = KubeClient.from_config(str(agent.kubeconfig))
    assert wait_until(lambda: any(p["metadata"]["name"] == "waiting" and p["metadata"]["namespace"] == agent.ns
                                  for p in kube.list_unbound_fractions()), 30, "the pod in the watch cache")
    pods = [p for p in kube.list_unbound_fractions() if p["metadata"]["namespace"] == agent.ns]
    assert [p["metadata"]["name"] for p in pods] == ["waiting"]  # work-a and work-b have a node
    nodes = [n for n in kube.labelled_nodes(ts) if n.get("test") == "least-privilege"]
    assert len(nodes) == 2
    [found] = unplaceable(pods, nodes)
    assert defaulted_time_slicing(pods[0]) == found
    assert kube.create_event(agent.ns, unplaceable_event(own, found, ["580.95.05"]))
    assert not kube.create_event(agent.ns, unplaceable_event(other, found, ["580.95.05"]))  # the other agent's: once
    events = admin(agent.plane, "get", "events", "-n", agent.ns, "--field-selector",
                   "reason=NoNodeServesTimeSlicing", "-o", "json").stdout
    [event] = json.loads(events)["items"]
    assert event["involvedObject"]["name"] == "waiting" and "webhook.defaultMode=sm-sharing" in event["message"]
