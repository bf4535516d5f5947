"""docs/development.md's "The local cluster" block (`bash node`), run as written from the repository root: `make
cluster-up`, its `export` of the KUBECONFIG that cluster-up prints and of the helm `make tools` built, the `helm
install` it shows, `make cluster-down`, then `make demo`.

It runs before the other real-node tests (conftest orders it first), while no other real node holds the machine's
one lock: each of these commands starts or stops a node of its own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from e2e.machine import machine_is_free
from e2e.names import REPO_ROOT
from e2e.node import GPU_UUIDS
from e2e.toolkit.tools import Tools
from testkit.docblocks import every_block

pytestmark = [pytest.mark.e2e, pytest.mark.real_node]


def run(command: str, env: dict[str, str], timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


# Four node operations in one test (cluster-up, helm install, cluster-down, make demo), each starting or stopping a
# real node on containerd 2: over the suite's 300 s per test on 2 cores; each command keeps its own timeout.
@pytest.mark.timeout(2400)
def test_the_local_cluster_block_runs_as_written(require_real_node):
    (block,) = every_block("node")
    assert block.doc == "docs/development.md"
    cluster_up, export, helm_install, cluster_down, demo = block.commands()
    assert (cluster_up, cluster_down, demo) == ("make cluster-up", "make cluster-down", "make demo")
    assert helm_install.startswith("helm install gpufrac charts/gpufrac ") and "values-local.yaml" in helm_install
    require_real_node()
    tools = Tools.find()
    # The user's PATH has no helm: the block's export is what finds the one `make tools` built.
    user_path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                                if d and not os.path.exists(os.path.join(d, "helm")))
    env = {**os.environ, "PATH": user_path, "GPUFRAC_NODE_LOCK_WAIT": os.environ.get("GPUFRAC_NODE_LOCK_WAIT", "900")}
    env.pop("KUBECONFIG", None)
    up = run(cluster_up, env)
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        (printed,) = re.findall(r"export KUBECONFIG=(\S+)", up.stdout)
        assert f"export KUBECONFIG=$PWD/{printed} " in export + " ", (printed, export)
        installed = run(f"{export}\ncommand -v helm\n{helm_install}", env, timeout=600)
        assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
        assert installed.stdout.splitlines()[0] == tools.helm, installed.stdout
        kubectl = [tools.kubectl, "--kubeconfig", str(REPO_ROOT / printed)]
        for workload in ("deployment/gpufrac-webhook", "daemonset/gpufrac-agent"):
            rollout = run(f"{' '.join(kubectl)} -n gpufrac-system rollout status {workload} --timeout=300s", env,
                          timeout=360)
            assert rollout.returncode == 0, rollout.stdout + rollout.stderr
        hooks = run(f"{' '.join(kubectl)} get mutatingwebhookconfiguration gpufrac -o json", env, timeout=60)
        assert hooks.returncode == 0, hooks.stderr
        assert all(h["clientConfig"].get("caBundle") for h in json.loads(hooks.stdout)["webhooks"])
    finally:
        down = run(cluster_down, env, timeout=600)
    assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]
    assert machine_is_free(), "make cluster-down left the real node's lock held"
    assert subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.find("gpufrac-node") < 0
    shown = run(demo, env, timeout=1800)
    assert shown.returncode == 0, shown.stdout[-3000:] + shown.stderr[-3000:]
    # The pinned limit as the NRI plugin rewrites it at creation: keyed by the notebook's two GPUs' UUIDs.
    pinned = ",".join(f"{uuid}=115016M" for uuid in GPU_UUIDS[:2])
    for line in ("NVIDIA_GPU_MEMORY_LIMIT=61440", f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={pinned}",
                 "GPU devices (from the agent's NRI plugin, as CDI devices): ", "webhook configurations left: none"):
        assert line in shown.stdout, shown.stdout[-4000:]
    notebook = next(line for line in shown.stdout.splitlines() if "GPU devices" in line and "nvidia1" in line
                    and "nvidia2" not in line)  # the notebook's two GPUs, and no other
    assert "nvidia0" in notebook and "nvidiactl" in notebook, notebook
    assert machine_is_free(), "make demo left the real node's lock held"
