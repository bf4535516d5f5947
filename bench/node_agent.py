"""The node agent on a simulated node: the real Agent (real pynvml over the fake libnvidia-ml.so.1, the fake
MPS control daemon, a fake /proc, pods from an in-memory API with a watch), 8 GPUs and 400 GPU processes, with 1,
50 or 200 fractional pods. Each size runs in its own process (python -m bench.node_agent) so RSS is its own.

Measured: one reconcile (`Agent.tick()`: NVML inventory and processes, daemon checks, node labels and condition,
audit of every GPU process through /proc, usage metrics) with nothing changed and right after a pod change, the
NVML share of it, one HTTP metrics scrape, the process RSS and CPU.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.procs import rss_mib
from e2e.toolkit.wait import wait_until
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import (
    DEFAULT_MPS_ROOT,
    FRACTIONAL_LABEL,
    FRACTIONAL_VALUE,
    CanonicalFraction,
    LimitEnv,
    format_pinned_mem_limit,
    mps_pipe_dir,
    pinned_limits,
    write_canonical,
)
from testkit.pods import running_pod

ROOT = Path(__file__).resolve().parent.parent
GPUS = 8
PROCESSES = 400
GPU_MIB = 143771
INTERVAL_S = 10.0  # the agent's default --interval (the chart does not change it)


def _cid(n: int) -> str:
    return f"{n:064x}"


def _uuid(i: int) -> str:
    return f"GPU-{i:08x}-0000-4000-8000-{i:012x}"


class MemoryKube:
    """The agent's Kubernetes edge in memory: pods listed, then changed through a watch."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.event_count = 0

    def list_pods(self, node: str) -> tuple[list[dict[str, Any]], str]:
        return list(self.pods), "1"

    def watch_pods(self, node: str, resource_version: str, timeout_seconds: int):
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            try:
                yield self.events.get(timeout=0.05)
            except queue.Empty:
                continue

    def patch_node_labels(self, node: str, labels: dict[str, str]) -> None:
        pass

    def patch_node_condition(self, node: str, condition: dict[str, Any]) -> None:
        pass

    def create_event(self, namespace: str, body: dict[str, Any]) -> bool:
        self.event_count += 1
        return True

    def evict_pod(self, namespace: str, name: str) -> bool:
        return False


def _annotations(request_mib: int, limit_mib: int, device: str) -> dict[str, str]:
    """What the webhook writes for one time-slicing container on one device (the contract's writer)."""
    return write_canonical([CanonicalFraction("app", ComputeMode.TIME_SLICING, request_mib, limit_mib,
                                              pinned_limits(limit_mib, 1), (device,))])


def _pod(i: int, rv: int = 1) -> dict[str, Any]:
    return running_pod(f"frac-{i}", uid=f"uid-{i}", containers={"app": _cid(i + 1)}, resource_version=str(rv),
                       labels={FRACTIONAL_LABEL: FRACTIONAL_VALUE, "bench/generation": str(rv)},
                       annotations=_annotations(8192, 16384, _uuid(i % GPUS)))


def _world(tmp: Path, pods: int) -> tuple[Path, Path, list[dict[str, Any]]]:
    """The fake NVML state, a fake /proc and the pods: 2 processes per fractional pod on its GPU, the rest of the
    400 processes in containers that are not fractional; 50 processes per GPU."""
    proc = tmp / "proc"
    gpus: list[dict[str, Any]] = [{"uuid": _uuid(g), "name": "NVIDIA H200", "memory_total_mib": GPU_MIB,
                                   "processes": []} for g in range(GPUS)]
    owners: list[int | None] = [i // 2 for i in range(2 * pods)] + [None] * (PROCESSES - 2 * pods)
    per_gpu = PROCESSES // GPUS
    slots = {g: per_gpu for g in range(GPUS)}
    # fractional processes go to their pod's GPU; the others fill what is left
    placed: list[tuple[int, int | None]] = []
    for owner in owners:
        if owner is not None:
            g = owner % GPUS
        else:
            g = max(slots, key=lambda k: slots[k])
        slots[g] -= 1
        placed.append((g, owner))
    for n, (g, owner) in enumerate(placed):
        pid = 10000 + n
        gpus[g]["processes"].append({"pid": pid, "used_memory_mib": 1024 + n % 4096, "sm_util": n % 100})
        d = proc / str(pid)
        d.mkdir(parents=True)
        container_id = _cid(owner + 1) if owner is not None else _cid(100000 + n)
        (d / "cgroup").write_text("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                                  f"uid_{owner if owner is not None else n}.slice/cri-containerd-{container_id}"
                                  ".scope\n")
        env = {"PATH": "/usr/bin", "HOME": "/root"}
        if owner is not None:
            env.update({LimitEnv.PIPE_DIRECTORY: mps_pipe_dir(DEFAULT_MPS_ROOT, ComputeMode.TIME_SLICING),
                        LimitEnv.MEMORY_REQUEST: "8192", LimitEnv.MEMORY_LIMIT: "16384",
                        LimitEnv.PINNED_MEM_LIMIT: format_pinned_mem_limit(pinned_limits(16384, 1)),
                        LimitEnv.VISIBLE_DEVICES: _uuid(owner % GPUS)})
        (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
    state = tmp / "nvml.json"
    state.write_text(json.dumps({"driver_version": "615.20", "cuda_driver_version": 13040, "gpus": gpus}))
    return state, proc, [_pod(i) for i in range(pods)]


def child(pods: int, ticks: int) -> dict[str, Any]:
    from testkit.fakes.build import MPS_CONTROL, fake_nvml_library

    ctypes.CDLL(str(fake_nvml_library()), mode=ctypes.RTLD_GLOBAL)  # so pynvml's dlopen finds it by soname
    tmp = Path(tempfile.mkdtemp(prefix="bench-agent-"))
    state, proc, pod_list = _world(tmp, pods)
    os.environ["GPUFRAC_FAKE_NVML"] = str(state)

    from prometheus_client import generate_latest

    from gpufrac.agent.edges.metrics import AgentMetrics
    from gpufrac.agent.edges.nvml import NvmlSource
    from gpufrac.agent.node.agent_config import AgentConfig
    from gpufrac.agent.node.node_loop import Agent
    from gpufrac.probes.server import ProbeServer, registry_text

    kube = MemoryKube(pod_list)
    config = AgentConfig(node="gpu-node-1", mps_binary=str(MPS_CONTROL), mps_root=tmp / "mps",
                         mps_log_root=tmp / "log", mps_config_dir=tmp / "cfg", proc_root=proc,
                         memory_limit_file=tmp / "memory.max", quit_timeout=5.0)
    metrics = AgentMetrics()
    nvml = NvmlSource()
    agent = Agent(config, kube, nvml, metrics)
    # as node_agent.probe_server builds it: importing that module would add its flags' modules (2.4 MiB) to the RSS
    server = ProbeServer("127.0.0.1:0", registry_text(metrics.registry),
                         {"/healthz": agent.healthz, "/readyz": agent.readyz})
    server.start()
    agent.start()
    try:
        if not agent.pods.synced.wait(10):
            raise RuntimeError("the pod cache did not sync")
        def daemons_up() -> bool:
            agent.tick()
            return bool(agent.supervisors) and all(s.status().up for s in agent.supervisors.values())

        wait_until(daemons_up, 20, "both fake MPS daemons")
        for _ in range(3):
            agent.tick()
        attributed = sum(1 for line in generate_latest(metrics.registry).decode().splitlines()
                         if line.startswith("gpufrac_container_gpu_memory_used_bytes{"))

        steady, changed, nvml_ms = [], [], []
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for t in range(ticks):
            t0 = time.perf_counter()
            agent.tick()
            steady.append(time.perf_counter() - t0)
            # a pod change: a MODIFIED event for one pod through the watch (a new label, as a status or label
            # update would bring)
            kube.events.put({"type": "MODIFIED", "object": _pod(t % pods, rv=100 + t)})
            wait_until(lambda rv=str(100 + t): any(p["metadata"]["resourceVersion"] == rv
                                                   for p in agent.pods.snapshot()),
                       5, "the watch event to reach the pod cache", interval=0.001)
            t0 = time.perf_counter()
            agent.tick()
            changed.append(time.perf_counter() - t0)
        cpu_per_tick = (time.process_time() - cpu0) / (2 * ticks)
        wall = time.perf_counter() - wall0
        for _ in range(ticks):
            t0 = time.perf_counter()
            nvml.inventory()
            nvml.processes()
            nvml_ms.append(time.perf_counter() - t0)

        url = f"http://127.0.0.1:{server.port}/metrics"
        scrapes = []
        body = b""
        for _ in range(max(5, ticks)):
            t0 = time.perf_counter()
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = resp.read()
            scrapes.append(time.perf_counter() - t0)
        series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
        return {
            "pods": pods, "gpus": GPUS, "processes": PROCESSES, "attributed_series": attributed,
            "violations": len(agent.violations),
            "tick_ms": statistics.median(steady) * 1000, "tick_max_ms": max(steady) * 1000,
            "changed_ms": statistics.median(changed) * 1000, "changed_max_ms": max(changed) * 1000,
            "nvml_ms": statistics.median(nvml_ms) * 1000,
            "scrape_ms": statistics.median(scrapes) * 1000, "scrape_bytes": len(body), "series": series,
            "rss_mib": rss_mib(), "cpu_ms_per_tick": cpu_per_tick * 1000,
            "cpu_pct_at_interval": cpu_per_tick / INTERVAL_S * 100, "wall_s": wall,
        }
    finally:
        server.stop()
        agent.shutdown()
        nvml.close()


def run(sizes: tuple[int, ...], ticks: int) -> list[dict[str, Any]] | str:
    try:
        from testkit.fakes.build import fake_nvml_library
        fake_nvml_library()
    except ImportError as err:
        return f"skipped: the GPU fakes (testkit/fakes) are not importable ({err})"
    except Exception as err:  # no C compiler, say
        return f"skipped: the fake NVML library could not be built ({err})"
    rows = []
    for pods in sizes:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        result = subprocess.run([sys.executable, "-m", "bench.node_agent", "--pods", str(pods), "--ticks", str(ticks)],
                                cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
        if result.returncode != 0:
            return f"failed for {pods} pods: {(result.stderr or result.stdout)[-1500:]}"
        rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
        print(f"[bench] agent {pods:>3d} pods: tick {rows[-1]['tick_ms']:.1f} ms, after change "
              f"{rows[-1]['changed_ms']:.1f} ms, RSS {rows[-1]['rss_mib']:.0f} MiB", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.node_agent")
    parser.add_argument("--pods", type=int, required=True)
    parser.add_argument("--ticks", type=int, default=10)
    args = parser.parse_args(argv)
    import logging
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    print(json.dumps(child(args.pods, args.ticks)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
