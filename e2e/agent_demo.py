"""`make agent-demo`: the node agent on fake GPUs against a local control plane, with a few fractional pods.

Starts etcd + kube-apiserver + the webhook (e2e.cluster), runs `gpufrac agent` with the fake NVML library and
MPS daemon, creates pods as alice (bound by the scheduler's binder, marked running as the kubelet would), gives
them GPU processes (one over its limit), and prints what the agent published: node labels and condition, the
Events, and its metrics.
"""

from __future__ import annotations

import shutil
import sys
import time

from e2e.agent_world import GPU_UUIDS, AgentWorld, metric_value
from e2e.cluster import ControlPlane
from e2e.demo_run import run_demo
from e2e.names import DEFAULT_WORKDIR
from e2e.toolkit.wait import wait_until


def main() -> int:
    workdir = DEFAULT_WORKDIR / "agent-demo"
    node_dir = workdir / "node"
    shutil.rmtree(node_dir, ignore_errors=True)
    cp = ControlPlane(workdir)
    world = AgentWorld(cp, node_dir)  # its fake node lives beside the cluster's files, which start() leaves alone
    return run_demo(cp, "etcd, kube-apiserver and the gpufrac webhook", lambda _: _agent_on_fake_gpus(world),
                    failures=(Exception,), explain=lambda exc: f"{exc}\n--- agent log ---\n{world.agent_log()}")


def _agent_on_fake_gpus(world: AgentWorld) -> None:
    try:
        _show(world)
    finally:
        world.stop_agent()


def _show(world: AgentWorld) -> None:
    print(f"== starting `gpufrac agent --node {world.node}` on 2 fake H200s (driver 615.20, CUDA 13.4)",
          flush=True)
    world.start_agent()
    print("== alice creates 3 fractional pods; the binder binds them; they start GPU processes", flush=True)
    train = world.create_pod("train", gpu_uuid=GPU_UUIDS[0], limit_mib=40000, request_mib=35943)
    notebook = world.create_pod("notebook", gpu_uuid=GPU_UUIDS[0], limit_mib=16000)
    infer = world.create_pod("infer", gpu_uuid=GPU_UUIDS[1], limit_mib=20000, mode="sm-sharing")
    world.start_process(train, used_mib=30000, sm_util=40)
    world.start_process(notebook, used_mib=18000, sm_util=5)  # over its 16000 MiB limit
    world.start_process(infer, used_mib=6000, sm_util=25)
    wait_until(lambda: world.events_for("notebook"), 30, "the over-limit event")
    wait_until(lambda: metric_value(world.metrics(), "gpufrac_container_gpu_memory_used_bytes",
                                    pod="infer") is not None, 30, "metrics")
    time.sleep(1)
    node = world.get_node()
    print("\n== node labels")
    for key, value in sorted(node["metadata"].get("labels", {}).items()):
        if key.startswith("gpufrac.io/"):
            print(f"  {key}={value}")
    cond = world.node_condition() or {}
    print(f"\n== node condition gpufrac.io/Ready={cond.get('status')} {cond.get('reason')}: "
          f"{cond.get('message')}")
    print("\n== events")
    for name in ("train", "notebook", "infer"):
        for event in world.events_for(name):
            print(f"  pod/{name} {event['type']} {event['reason']}: {event['message']}")
    print(f"\n== metrics (http://127.0.0.1:{world.port}/metrics, gpufrac_* only)")
    for line in world.metrics().splitlines():
        if line.startswith("gpufrac_") and "_created" not in line:
            print(f"  {line}")
    print("\n== stopping the agent (SIGTERM: the MPS daemons get `quit`)")
    world.stop_agent()
    cond = world.node_condition() or {}
    print(f"  node condition now {cond.get('status')} {cond.get('reason')}")
    for mode in ("time-slicing", "sm-sharing"):
        quits = [r for r in world.daemon_records(mode) if r.get("command") == "quit"]
        print(f"  {mode} daemon received quit: {bool(quits)}")


if __name__ == "__main__":
    sys.exit(main())
