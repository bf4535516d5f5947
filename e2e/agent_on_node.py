"""What the real-node tests read of the agent on the node and do beside it: its conditions and CSI driver's
registration, the MPS control daemons on the host, the seed pods started as the scheduler would."""

from __future__ import annotations

import json
from pathlib import Path

from e2e.names import NODE_NAME, USER_NAMESPACE
from e2e.node import RealCluster
from e2e.pods import SEED_BINDS, SEED_EXAMPLES, bind, create, get_json, release_pods, wait_running
from e2e.testing import example
from gpufrac.agent.edges.procfs import mps_control_processes

DRIVER = "mps.gpufrac.io"
KAI_CONDITION = "gpu-sharing.nvidia.com/Ready"
OWN_CONDITION = "gpufrac.io/Ready"
MODES = ("time-slicing", "sm-sharing")
MPS_ROOT = Path("/run/gpufrac/mps")  # values.yaml mps.root and mps.logRoot: host paths


def daemon_pids() -> dict[str, list[int]]:
    """The MPS control daemons on the host, found as the agent finds them (their env names the pipe directory)."""
    return {mode: mps_control_processes(Path("/proc"), MPS_ROOT / mode) for mode in MODES}


def condition(node: RealCluster, kind: str) -> dict:
    conditions = get_json(node, "get", "node", NODE_NAME)["status"].get("conditions", [])
    return next((c for c in conditions if c["type"] == kind), {})


def both_ready(node: RealCluster) -> bool:
    return all(condition(node, kind).get("status") == "True" for kind in (KAI_CONDITION, OWN_CONDITION))


def registered_drivers(node: RealCluster) -> list[str]:
    res = node.kubectl("get", "csinode", NODE_NAME, "-o", "json", user="admin")
    if res.rc != 0:
        return []
    return [d["name"] for d in json.loads(res.stdout)["spec"].get("drivers") or []]


def agent_ready(node: RealCluster) -> dict | None:
    pods = release_pods(node, "agent")
    if len(pods) != 1:
        return None
    statuses = pods[0].get("status", {}).get("containerStatuses", [])
    return pods[0] if statuses and all(s.get("ready") for s in statuses) else None


def delete(node: RealCluster, *names: str) -> None:
    node.kubectl("delete", "pod", "-n", USER_NAMESPACE, "--wait=false", "--grace-period=0", "--force", *names,
                 user="admin")


def seed_pod(seed: str, name: str) -> dict:
    manifest = example(SEED_EXAMPLES[seed][0], name)
    manifest["spec"]["terminationGracePeriodSeconds"] = 1
    return manifest


def start_seed(node: RealCluster, seed: str, name: str) -> dict:
    res = create(node, seed_pod(seed, name))
    assert res.rc == 0, res.stderr
    bind(node, name, SEED_BINDS[seed])
    return wait_running(node, name)

