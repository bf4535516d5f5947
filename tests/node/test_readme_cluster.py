"""The README's "The local cluster" block (`bash node`), run as written from the repository root: `make cluster-up`,
the `helm install` it shows (with the KUBECONFIG that cluster-up prints), `make cluster-down`, then `make demo`.

It runs before the other real-node tests (conftest orders it first), while no other real node holds the machine's
one lock: each of these commands starts or stops a node of its own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from e2e.cluster import REPO_ROOT, Tools
from e2e.node import machine_is_free
from tests.docblocks import blocks
from tests.node.conftest import require_real_node

pytestmark = [pytest.mark.e2e, pytest.mark.real_node]


def run(command: str, env: dict[str, str], timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_the_local_cluster_block_runs_as_written():
    (block,) = blocks("README.md", "node")
    cluster_up, helm_install, cluster_down, demo = block.commands()
    assert (cluster_up, cluster_down, demo) == ("make cluster-up", "make cluster-down", "make demo")
    assert helm_install.startswith("helm install gpufrac charts/gpufrac ") and "values-local.yaml" in helm_install
    require_real_node()
    tools = Tools.find()  # helm and kubectl on PATH, as a user has them
    path = [str(Path(tools.helm).parent), str(Path(tools.kubectl).parent), os.environ.get("PATH", "")]
    env = {**os.environ, "PATH": os.pathsep.join(path),
           "GPUFRAC_NODE_LOCK_WAIT": os.environ.get("GPUFRAC_NODE_LOCK_WAIT", "900")}
    up = run(cluster_up, env)
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        (kubeconfig,) = re.findall(r"export KUBECONFIG=(\S+)", up.stdout)
        env["KUBECONFIG"] = str(REPO_ROOT / kubeconfig)
        installed = run(helm_install, env, timeout=600)
        assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
        for workload in ("deployment/gpufrac-webhook", "daemonset/gpufrac-agent"):
            rollout = run(f"kubectl -n gpufrac-system rollout status {workload} --timeout=300s", env, timeout=360)
            assert rollout.returncode == 0, rollout.stdout + rollout.stderr
        hooks = run("kubectl get mutatingwebhookconfiguration gpufrac -o json", env, timeout=60)
        assert hooks.returncode == 0, hooks.stderr
        assert all(h["clientConfig"].get("caBundle") for h in json.loads(hooks.stdout)["webhooks"])
    finally:
        down = run(cluster_down, env, timeout=600)
    assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]
    assert machine_is_free(), "make cluster-down left the real node's lock held"
    assert subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.find("gpufrac-node") < 0
    shown = run(demo, env, timeout=1800)
    assert shown.returncode == 0, shown.stdout[-3000:] + shown.stderr[-3000:]
    for line in ("NVIDIA_GPU_MEMORY_LIMIT=61440", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=115016M,1=115016M",
                 "webhook configurations left: none"):
        assert line in shown.stdout, shown.stdout[-4000:]
    assert machine_is_free(), "make demo left the real node's lock held"
