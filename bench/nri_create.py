"""Container creation with the agent's NRI plugin and without, side by side in one run, on the real node's
containerd 2 run alone (its CRI with NRI and CDI on, runc, fake GPUs with NVIDIA-shaped CDI specs:
e2e.toolkit.cri_node), and the plugin's CPU per container it decided.

The bench is the CRI client (the kubelet's part): one pod sandbox (host network) whose annotations are a bound
fraction's, then CreateContainer of the fractional container (its limit env as the kubelet resolves it) and of a
container that is no fraction (with NVIDIA_VISIBLE_DEVICES=all), each removed again, timed at the client. Rounds
alternate: without a plugin, then with the plugin registered. The plugin is the agent's own code (NriPlugin, the wire
session, decide) in a process of its own (`python -m bench.nri_create plugin ...`), so its CPU (getrusage) is its own;
it decides with the node's CDI specs and device nodes, and every mode served.

The CRI stubs are generated into the work directory from k8s.io/cri-api's api.proto (Go module proxy); nothing is
committed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

from testkit.grpc_stubs import stubs_from

ROOT = Path(__file__).resolve().parent.parent
CRI_API_VERSION = os.environ.get("CRI_API_VERSION", "v0.36.3")
STUB = "cri_runtime_v1"
H200_MIB = 143771
KINDS = ("fraction", "plain")  # the containers created in turn: a bound fraction's, and one that is no fraction
FRACTION_CONTAINER = "app"  # the fraction's container, as its pod's annotations name it


def cri_stubs(out: Path) -> tuple[ModuleType, ModuleType]:
    """(messages, services) of the CRI, generated with grpcio-tools from k8s.io/cri-api's api.proto."""
    proto = out / f"{STUB}.proto"
    if not proto.exists():  # from the Go module proxy, once per `out`
        res = subprocess.run(["go", "mod", "download", "-json", f"k8s.io/cri-api@{CRI_API_VERSION}"],
                             capture_output=True, text=True,
                             env={**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"})
        if res.returncode != 0:
            raise RuntimeError(f"go mod download k8s.io/cri-api@{CRI_API_VERSION}: {res.stderr.strip()}")
        out.mkdir(parents=True, exist_ok=True)
        proto.write_bytes((Path(json.loads(res.stdout)["Dir"]) / "pkg/apis/runtime/v1/api.proto").read_bytes())
    return stubs_from(proto, out, STUB)


# ---- the plugin process ----


def plugin_main(argv: list[str]) -> int:
    """Runs the agent's NRI plugin against `--socket`; prints `registered` and, on SIGTERM, its CPU and count."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--cdi-dir", type=Path, required=True)
    parser.add_argument("--gpus", required=True, help="comma list of the node's GPU UUIDs, in index order")
    args = parser.parse_args(argv)
    from gpufrac.agent.decide.model import GpuInfo
    from gpufrac.agent.edges.cdi_specs import CdiSpecs, gpu_device_nodes
    from gpufrac.agent.nri.config import NriConfig
    from gpufrac.agent.nri.decide.creation import NodeFacts
    from gpufrac.agent.nri.plugin import NriPlugin, PluginState
    from gpufrac.core.annotations import ComputeMode

    gpus = tuple(GpuInfo(i, u, "NVIDIA H200", H200_MIB << 20) for i, u in enumerate(args.gpus.split(",")))
    cdi = CdiSpecs([args.cdi_dir])
    decided: list[str] = []

    class Sink:
        def decided(self, pod: Any, container: Any, result: Any) -> None:
            decided.append(str(result.outcome))

        def swept(self, found: Any) -> None:
            pass

        def state_changed(self, state: PluginState) -> None:
            if state is PluginState.REGISTERED:
                print(json.dumps({"registered": True, "cpu_s": _cpu()}), flush=True)

    def facts() -> NodeFacts:  # what the agent's NriService computes per creation
        return NodeFacts(gpus, cdi.names(), gpu_device_nodes(gpus), dict.fromkeys(ComputeMode))

    plugin = NriPlugin(NriConfig(args.socket, name="gpufrac-bench", lock_file=None), facts, Sink())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: (stop.set(), plugin.stop()))
    plugin.run(stop)
    print(json.dumps({"cpu_s": _cpu(), "decided": decided}), flush=True)
    return 0


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class PluginProcess:
    def __init__(self, socket_path: Path, cdi_dir: Path, gpus: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.nri_create", "plugin", "--socket", str(socket_path), "--cdi-dir",
             str(cdi_dir), "--gpus", ",".join(gpus)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the plugin process ended before it registered")
        self.registered_cpu_s = json.loads(line)["cpu_s"]

    def stop(self) -> dict[str, Any]:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=30)
        return json.loads(out.strip().splitlines()[-1])


# ---- the CRI client ----


class Cri:
    def __init__(self, socket_path: Path, stubs: tuple[ModuleType, ModuleType], log_dir: Path) -> None:
        import grpc

        self.pb, rpc = stubs
        self.channel = grpc.insecure_channel(f"unix://{socket_path}")
        self.runtime = rpc.RuntimeServiceStub(self.channel)
        self.log_dir = log_dir

    def sandbox(self, name: str, annotations: dict[str, str]) -> tuple[str, Any]:
        pb = self.pb
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=str(uuid.uuid4()), namespace="bench", attempt=0),
            log_directory=str(self.log_dir / name), annotations=annotations,  # host network: no hostname
            linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(network=pb.NODE))))
        (self.log_dir / name).mkdir(parents=True, exist_ok=True)
        return self.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=60).pod_sandbox_id, config

    def create(self, sandbox_id: str, sandbox_config: Any, name: str, attempt: int, image: str,
               env: dict[str, str]) -> float:
        """CreateContainer then RemoveContainer; returns CreateContainer's seconds (raises on a refusal). The
        name is the pod's container name, which the plugin reads the fraction by; the attempt keeps it unique."""
        pb = self.pb
        config = pb.ContainerConfig(metadata=pb.ContainerMetadata(name=name, attempt=attempt),
                                    image=pb.ImageSpec(image=image), command=["sleep", "infinity"],
                                    envs=[pb.KeyValue(key=k, value=v.encode()) for k, v in env.items()],
                                    log_path=f"{name}-{attempt}.log")
        started = time.perf_counter()
        created = self.runtime.CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox_config), timeout=60)
        elapsed = time.perf_counter() - started
        self.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=created.container_id), timeout=60)
        return elapsed

    def remove_sandbox(self, sandbox_id: str) -> None:
        pb = self.pb
        self.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=60)
        self.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=60)


def fraction_workload(gpu: str) -> tuple[dict[str, str], dict[str, str]]:
    """A bound sm-sharing fraction's pod annotations and its container's env (as the webhook and kubelet give it)."""
    from gpufrac.core.annotations import ComputeMode
    from gpufrac.core.contract import CanonicalFraction, LimitEnv, format_pinned_mem_limit, write_canonical

    fraction = CanonicalFraction(FRACTION_CONTAINER, ComputeMode.SM_SHARING, 40960, 61440, {0: 61440}, (gpu,))
    env = {LimitEnv.VISIBLE_DEVICES: gpu, LimitEnv.MEMORY_REQUEST: "40960", LimitEnv.MEMORY_LIMIT: "61440",
           LimitEnv.PINNED_MEM_LIMIT: format_pinned_mem_limit({0: 61440}),
           LimitEnv.PIPE_DIRECTORY: "/run/gpufrac/mps/sm-sharing"}
    return write_canonical([fraction]), {str(k): v for k, v in env.items()}


def _summary(seconds: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in seconds)
    # nearest rank: the smallest value with 95 % of the samples at or below it (with 2 samples, the larger one)
    return {"n": len(ms), "p50_ms": statistics.median(ms), "p95_ms": ms[math.ceil(0.95 * len(ms)) - 1],
            "mean_ms": statistics.fmean(ms)}


def _check_outcomes(outcomes: Counter[str], rounds: int, per_round: int) -> None:
    """The plugin decided as the workload means it to: every measured fraction injected, every other container's
    NVIDIA_VISIBLE_DEVICES voided, nothing refused; else the numbers measure something else. (Each round's warm-up
    creation is a fraction too, decided or not: the first after a registration may reach the plugin late.)"""
    fractions, plain = rounds * ((per_round + 1) // 2), rounds * (per_round // 2)
    injected, voided = outcomes.get("injected", 0), outcomes.get("voided", 0)
    others = {k: v for k, v in outcomes.items() if k not in ("injected", "voided")}
    if not fractions <= injected <= fractions + rounds or voided != plain or others:
        raise RuntimeError(f"the plugin decided {dict(outcomes)}, not {fractions} (+ up to {rounds} warm-ups) injected "
                           f"and {plain} voided: the bench's workload is not what it means to measure")


def run(rounds: int, per_round: int, workdir: Path) -> dict[str, Any]:
    """Starts containerd alone (e2e.toolkit.cri_node: the real node's runtime and config, its fake GPUs, no
    kubelet, no machine lock), measures, stops it."""
    from e2e.node import GPU_UUIDS, IMAGES_DIR, PAUSE_IMAGE, images_missing
    from e2e.toolkit.cri_node import IMAGE_ARCHIVES, CriNode
    from e2e.toolkit.tools import node_binaries

    if os.geteuid() != 0:
        return {"skipped": "containerd needs root"}
    node_binaries()
    if missing := [a for a in images_missing() if a in IMAGE_ARCHIVES]:
        return {"skipped": f"missing images {', '.join(missing)}: run `make image`"}
    stubs = cri_stubs(workdir / "cri-stubs")
    load_before = os.getloadavg()
    root = Path(f"/tmp/gpufrac-bench-nri-{os.getpid()}")  # short: unix socket paths
    node = CriNode(root, PAUSE_IMAGE, GPU_UUIDS)
    try:
        node.start(IMAGES_DIR)
        return _measure(node, stubs, rounds, per_round, workdir, load_before)
    finally:
        node.stop()
        shutil.rmtree(root, ignore_errors=True)


def _measure(node: Any, stubs: tuple[ModuleType, ModuleType], rounds: int, per_round: int, workdir: Path,
             load_before: tuple[float, float, float]) -> dict[str, Any]:
    from e2e.node import APP_IMAGE, GPU_UUIDS

    cri = Cri(node.socket, stubs, workdir / "pod-logs")
    annotations, fraction_env = fraction_workload(GPU_UUIDS[1])
    sandbox_id, sandbox_config = cri.sandbox("bench-nri", annotations)
    plain_env = {"NVIDIA_VISIBLE_DEVICES": "all"}
    times: dict[str, list[float]] = {"without": [], "with": []}
    by_kind: dict[str, dict[str, list[float]]] = {phase: {kind: [] for kind in KINDS} for phase in times}
    cpu_s, outcomes = 0.0, Counter[str]()
    attempts = itertools.count()
    for _ in range(rounds):
        for phase in ("without", "with"):
            plugin = PluginProcess(node.nri_socket, node.cdi_dir, list(GPU_UUIDS)) if phase == "with" else None
            try:
                # containerd still calls a plugin that went away once (its list is updated after the next
                # request): that first creation is not measured
                cri.create(sandbox_id, sandbox_config, FRACTION_CONTAINER, next(attempts), APP_IMAGE, fraction_env)
                for i in range(per_round):
                    kind = KINDS[i % 2]
                    name, env = (FRACTION_CONTAINER, fraction_env) if kind == "fraction" else ("sidecar", plain_env)
                    seconds = cri.create(sandbox_id, sandbox_config, name, next(attempts), APP_IMAGE, env)
                    times[phase].append(seconds)
                    by_kind[phase][kind].append(seconds)
            finally:
                if plugin is not None:
                    report = plugin.stop()
                    cpu_s += report["cpu_s"] - plugin.registered_cpu_s
                    outcomes.update(report["decided"])
    cri.remove_sandbox(sandbox_id)
    _check_outcomes(outcomes, rounds, per_round)
    without, with_plugin = _summary(times["without"]), _summary(times["with"])
    decided = sum(outcomes.values())
    return {"without": without, "with": with_plugin, "added_p50_ms": with_plugin["p50_ms"] - without["p50_ms"],
            "by_kind": {phase: {kind: _summary(s) for kind, s in kinds.items()} for phase, kinds in by_kind.items()},
            "plugin_cpu_ms_per_container": 1000 * cpu_s / decided if decided else float("nan"),
            "decided": decided, "outcomes": dict(outcomes), "rounds": rounds, "per_round": per_round,
            "load_before": load_before, "load": os.getloadavg()}


if __name__ == "__main__":
    if sys.argv[1:2] == ["plugin"]:
        raise SystemExit(plugin_main(sys.argv[2:]))
    parser = argparse.ArgumentParser(prog="python -m bench.nri_create")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-round", type=int, default=40)
    parser.add_argument("--workdir", type=Path, default=ROOT / ".e2e" / "bench-nri")
    a = parser.parse_args()
    print(json.dumps(run(a.rounds, a.per_round, a.workdir), indent=2))
