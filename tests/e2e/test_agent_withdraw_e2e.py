"""`gpufrac agent-withdraw` against a real kube-apiserver: a stopped agent leaves its labels and conditions on its
node (a rolling update must not flap them); the withdrawal deletes the DaemonSet and takes them off, and leaves
everything else on the node. The agent runs as its own process with the GPU fakes, for a node of its own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from e2e.agent_world import AgentWorld
from e2e.names import REPO_ROOT
from e2e.testing import unique
from e2e.toolkit.wait import wait_until

pytestmark = pytest.mark.e2e

PUBLISHED = {"gpufrac.io/enforcement.time-slicing", "gpufrac.io/enforcement.sm-sharing",
             "gpufrac.io/driver-version.major", "gpufrac.io/gpu-count"}
CONDITIONS = {"gpufrac.io/Ready", "gpu-sharing.nvidia.com/Ready", "gpu-fractioning.nvidia.com/Ready"}
FOREIGN_CONDITION = {"type": "example.com/Other", "status": "True", "reason": "Someone", "message": "not ours"}


@pytest.fixture(scope="module")
def world(cluster, tmp_path_factory):
    node = unique("withdraw-node")
    body = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node, "team": "gpu"}}}
    assert cluster.kubectl("create", "-f", "-", input=json.dumps(body), user="admin").rc == 0
    patch = json.dumps({"status": {"conditions": [FOREIGN_CONDITION]}})
    assert cluster.kubectl("patch", "node", node, "--subresource=status", "--type=strategic", "-p", patch,
                           user="admin").rc == 0
    w = AgentWorld(cluster, tmp_path_factory.mktemp("withdraw-node"), node=node)
    yield w
    w.stop_agent()
    cluster.kubectl("delete", "node", node, "--wait=false", user="admin")


def state(world: AgentWorld) -> tuple[dict[str, str], set[str]]:
    node = world.get_node()
    return node["metadata"].get("labels", {}), {c["type"] for c in node.get("status", {}).get("conditions", [])}


def withdraw(world: AgentWorld, namespace: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufrac", "agent-withdraw", "--kubeconfig", str(world.cp.kubeconfigs["admin"]),
         "--namespace", namespace, "--agent-daemonset", "gpufrac-agent", "--agent-selector",
         "app.kubernetes.io/component=agent", "--mps-daemonset", "gpufrac-mps", "--mps-selector",
         "app.kubernetes.io/component=mps", "--timeout", "10"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)


def test_a_stopped_agent_leaves_its_labels_and_the_withdrawal_takes_them_off(world, admin, ns):
    world.start_agent()
    wait_until(lambda: PUBLISHED <= set(state(world)[0]) and CONDITIONS <= state(world)[1], what="the agent's labels")
    world.stop_agent()  # what a rolling update does to it
    labels, conditions = state(world)
    assert PUBLISHED <= set(labels) and CONDITIONS <= conditions
    assert world.node_condition()["reason"] == "AgentStopped"

    for name, component in (("gpufrac-agent", "agent"), ("gpufrac-mps", "mps")):  # the release's, in the test's ns
        assert admin("create", "-f", "-", input=json.dumps(daemonset(name, component))).rc == 0
    result = withdraw(world, ns)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stderr.splitlines()[-1])
    assert world.node in summary["nodes"] and summary["agents_stopped_s"] is not None
    labels, conditions = state(world)
    assert not [k for k in labels if k.startswith("gpufrac.io/")], labels
    assert labels["team"] == "gpu" and labels["kubernetes.io/hostname"] == world.node
    assert conditions == {FOREIGN_CONDITION["type"]}
    assert admin("get", "daemonset", "gpufrac-agent").rc != 0
    assert admin("get", "daemonset", "gpufrac-mps").rc != 0

    again = withdraw(world, ns)  # the Job retried, or run by hand: nothing to do, no error
    assert again.returncode == 0, again.stderr
    assert world.node not in json.loads(again.stderr.splitlines()[-1])["nodes"]


def daemonset(name: str, component: str) -> dict:
    labels = {"app.kubernetes.io/component": component}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "c", "image": "example.invalid/none"}]}}}}
