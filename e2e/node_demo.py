"""`make demo`: a real one-node cluster, gpufrac installed with helm as a user installs it, the two seed
examples bound as KAI's binder binds them, what the process inside each sees, then helm uninstall."""

from __future__ import annotations

import json
from pathlib import Path

from e2e.demo_run import run_demo, say
from e2e.install import LOCAL_VALUES, Helm
from e2e.node import RealCluster
from e2e.pods import SEED_BINDS, bind, exec_in, wait_running
from e2e.testing import example
from e2e.toolkit.errors import ClusterError

SEEDS = {"inference": "inference-sm-sharing.yaml", "notebook": "notebook-time-slicing.yaml"}
SEEN = ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_GPU_MEMORY_REQUEST", "NVIDIA_GPU_MEMORY_LIMIT",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_PIPE_DIRECTORY")


def run_node_demo(workdir: Path) -> int:
    return run_demo(RealCluster(workdir), "a real node: etcd, kube-apiserver, containerd, kubelet, "
                    "controller-manager, scheduler, kube-proxy", _install_bind_uninstall, failures=(ClusterError,),
                    remove_workdir=True)  # the machine goes back as it was


def _install_bind_uninstall(node: RealCluster) -> None:
    helm = Helm(node)
    say(f"== helm install gpufrac charts/gpufrac -n gpufrac-system --create-namespace -f "
        f"{LOCAL_VALUES.relative_to(LOCAL_VALUES.parents[2])}")
    helm.install()
    say(node.kubectl("get", "pods", "-n", "gpufrac-system", "-o", "wide", user="admin").stdout.rstrip())
    for name, filename in SEEDS.items():
        say(f"\n== alice: kubectl apply -f examples/{filename}")
        res = node.kubectl("create", "-f", "-", input=json.dumps(example(filename, name)))
        if res.rc != 0:
            raise ClusterError(res.stderr.strip())
        say(f"== the binder: annotations {sorted(SEED_BINDS[name])}, then pods/binding to the node")
        bind(node, name, SEED_BINDS[name])
        wait_running(node, name)
        say(f"== inside {name}: env, GPU devices, and the MPS pipe directory")
        env = dict(line.split("=", 1) for line in exec_in(node, name, "env").splitlines() if "=" in line)
        for key in SEEN:
            say(f"   {key}={env.get(key, '(unset)')}")
        devices = exec_in(node, name, "ls /dev | grep '^nvidia' || true").split()
        say(f"   GPU devices (from the agent's NRI plugin, as CDI devices): {' '.join(devices) or 'none'}")
        pipe = env.get("CUDA_MPS_PIPE_DIRECTORY", "")
        say(f"   ls {pipe}: {' '.join(exec_in(node, name, f'ls {pipe}').split())}")
        # the two seeds share GPUs 0-1 in different modes, which KAI never does and the NRI plugin refuses
        say(f"== kubectl delete pod {name} (its GPUs serve {name}'s mode while it runs)")
        node.kubectl("delete", "pod", name, "--grace-period=0", "--force", "--wait=true")
    say("\n== helm uninstall gpufrac -n gpufrac-system")
    helm.uninstall()
    left = node.kubectl("get", "mutatingwebhookconfigurations,validatingwebhookconfigurations", user="admin")
    say(f"   webhook configurations left: {left.stdout.strip() or 'none'}")
