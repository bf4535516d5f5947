"""The agent's DRA driver answering the kubelet: NodePrepareResources and NodeUnprepareResources through the real
gRPC unix socket, per claim, and the CPU the driver's process spends on each.

The driver is the agent's own code (DraDriver behind DraPlugin, the vendored dra/v1 service) in a process of its own
(`python -m bench.dra_prepare serve ...`), so its CPU time is its own: the bench reads that process's CPU clock
(clock_gettime on its pid's process clock: nanoseconds, every thread, those gone included) around each call. It
writes each claim's CDI spec and its state file for real, fsync and rename included, in the work directory; the
JSON log lines it writes at info go to /dev/null. The one thing made up is the API server: the driver's
`get_claim` is answered in its process from the allocated claim objects the bench wrote for it (shaped as the
scheduler leaves them, as tests/agent/test_dra_decide.py builds them), so reading the claim from the API server is
not in the figures.

The bench is the kubelet: one claim per call, as for a pod with one claim. A round prepares its claims one after
another (half time-slicing on GPU 0, half sm-sharing on GPU 1, so the state file holds up to a round's claims),
then unprepares them; each call alternates with the same call naming no claim (the gRPC and socket floor, the
driver doing nothing). The section fails when the driver answered anything but what it means to measure: every
claim prepared with its CDI devices and spec, every spec and record removed by Unprepare.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NODE = "bench-dra-node"
GIB = 1 << 30
MODES = (("time-slicing", 0, None), ("sm-sharing", 1, "25"))  # mode, GPU index, consumed compute (percent)
CLAIM_MEMORY, CLAIM_LIMIT = "1Gi", "2Gi"  # a round's claims all fit on their GPU (81000 MiB usable)
USABLE = {"gpufrac.io/gpu-memory-usable-mib.NVIDIA-H100-80GB-HBM3": "81000"}
KINDS = ("prepare", "prepare_empty", "unprepare", "unprepare_empty")
WARM_UP = 5  # unmeasured empty calls of each kind: the channel's connect, the first calls' allocations


def gpu_uuid(index: int) -> str:
    return f"GPU-{index}1111111-bbbb"


def claim_object(uid: str, mode: str, gpu: int, compute: str | None) -> dict[str, Any]:
    """An allocated ResourceClaim as the driver reads it from the API server (the shape of
    tests/agent/test_dra_decide.py's `claim` and `limit_config`): one request, its device, consumed capacity and an
    opaque memory limit."""
    consumed = {"memory": CLAIM_MEMORY, **({"compute": compute} if compute else {})}
    result = {"request": "gpu", "driver": "gpu.gpufrac.io", "pool": NODE, "device": f"gpu-{gpu}-{mode}",
              "shareID": f"share-{uid}", "consumedCapacity": consumed}
    config = {"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpu.gpufrac.io", "parameters": {
        "apiVersion": "gpu.gpufrac.io/v1alpha1", "kind": "GpuConfig", "memoryLimit": CLAIM_LIMIT}}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": "bench", "name": f"claim-{uid}", "uid": uid},
            "status": {"allocation": {"devices": {"results": [result], "config": [config]}}}}


def claims_for(rounds: int, per_round: int) -> list[list[dict[str, Any]]]:
    """Each round's claims, the modes in turn, each with a UID of its own (the kubelet's claims are all distinct)."""
    return [[claim_object(f"r{r}-c{i}", *MODES[i % len(MODES)]) for i in range(per_round)] for r in range(rounds)]


# ---- the driver's process ----


class ClaimsOnly:
    """The SliceApi the driver gets: `get_claim` from the claim objects given, no ResourceSlices (not measured)."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self._claims = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects}

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._claims.get((namespace, name))

    def list_slices(self, node: str) -> list[dict[str, Any]]:
        return []

    def create_slice(self, body: dict[str, Any]) -> None:
        pass

    def replace_slice(self, body: dict[str, Any], resource_version: str) -> None:
        pass

    def delete_slice(self, name: str) -> None:
        pass


def serve_main(argv: list[str]) -> int:
    """Serves the driver on `--socket` until its stdin closes; prints `ready` first, the claims left at the end."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--dir", type=Path, required=True, help="its CDI spec directory, state file and /dev")
    parser.add_argument("--claims", type=Path, required=True, help="the claim objects get_claim answers with (JSON)")
    args = parser.parse_args(argv)
    from gpufrac.agent.decide.model import GpuInfo, Inventory
    from gpufrac.agent.dra.decide.slices import DRIVER
    from gpufrac.agent.dra.driver import DraDriver, dra_node
    from gpufrac.agent.dra.files import ClaimSpecs, StateFile
    from gpufrac.agent.dra.plugin import DraPlugin
    from gpufrac.core.jsonlog import setup_logging

    setup_logging("info")  # as the agent logs, into /dev/null (stderr stays for a traceback)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(open(os.devnull, "w"))  # for the process's life
    inventory = Inventory("615.10", 13040, tuple(GpuInfo(i, gpu_uuid(i), "NVIDIA H100 80GB HBM3", 80 * GIB)
                                                 for i in range(2)))
    dev = args.dir / "dev"
    dev.mkdir(parents=True, exist_ok=True)
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (dev / name).touch()
    node = dra_node(NODE, inventory, USABLE, str(args.dir / "mps"), [mode for mode, _, _ in MODES],
                    frozenset(f"nvidia.com/gpu={gpu.uuid}" for gpu in inventory.gpus), dev=dev)
    driver = DraDriver(lambda: node, ClaimsOnly(json.loads(args.claims.read_text())), ClaimSpecs(args.dir / "cdi"),
                       StateFile(args.dir / "state" / "prepared.json"), lambda: inventory.driver_version)
    plugin = DraPlugin(DRIVER, args.socket, None, driver)
    plugin.start()
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.read()  # until the bench closes it (or goes away)
    plugin.stop()
    print(json.dumps({"prepared_left": len(driver.claims())}), flush=True)
    return 0


def cpu_clock(pid: int) -> int:
    """The clock id of a process's CPU time (glibc's clock_getcpuclockid: MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)):
    every thread of it, those that ended included, in nanoseconds, read without disturbing it."""
    return ((~pid) << 3) | 2


class DriverProcess:
    def __init__(self, socket_path: Path, directory: Path, claims_file: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.dra_prepare", "serve", "--socket", str(socket_path), "--dir",
             str(directory), "--claims", str(claims_file)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True)
        assert self.proc.stdout is not None
        if not self.proc.stdout.readline():
            self.proc.wait(timeout=30)
            raise RuntimeError(f"the driver's process ended before it served (exit {self.proc.returncode})")
        self.clock = cpu_clock(self.proc.pid)

    def cpu_s(self) -> float:
        return time.clock_gettime(self.clock)

    def stop(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        lines = self.proc.stdout.read().strip().splitlines()
        self.proc.wait(timeout=30)
        return json.loads(lines[-1]) if lines else {}


# ---- the kubelet's side ----


class Kubelet:
    """Calls the driver as the kubelet does, one call at a time; keeps each call's wall time and the driver's CPU."""

    def __init__(self, socket_path: Path, driver: DriverProcess) -> None:
        import grpc

        from gpufrac.agent.dra.stubs import dra_pb2, dra_pb2_grpc

        self.pb = dra_pb2
        self.channel = grpc.insecure_channel(f"unix://{socket_path}")
        self.stub = dra_pb2_grpc.DRAPluginStub(self.channel)
        self.driver = driver
        self.samples: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
        self.by_mode: dict[str, list[tuple[float, float]]] = {mode: [] for mode, _, _ in MODES}

    def call(self, kind: str, claims: list[dict[str, Any]], measured: bool = True) -> Any:
        pb = self.pb
        refs = [pb.Claim(namespace=c["metadata"]["namespace"], name=c["metadata"]["name"], uid=c["metadata"]["uid"])
                for c in claims]
        method, request = ((self.stub.NodePrepareResources, pb.NodePrepareResourcesRequest(claims=refs))
                           if kind.startswith("prepare") else
                           (self.stub.NodeUnprepareResources, pb.NodeUnprepareResourcesRequest(claims=refs)))
        cpu = self.driver.cpu_s()
        started = time.perf_counter()
        response = method(request, timeout=30)
        sample = (time.perf_counter() - started, self.driver.cpu_s() - cpu)
        if measured:
            self.samples[kind].append(sample)
            if kind == "prepare":
                self.by_mode[_mode(claims[0])].append(sample)
        return response

    def close(self) -> None:
        self.channel.close()


def _mode(claim: dict[str, Any]) -> str:
    device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
    return next(mode for mode, _, _ in MODES if device.endswith(mode))


def _alternated(kubelet: Kubelet, kind: str, claim: dict[str, Any], real_first: bool) -> Any:
    """The call for the claim and the same call for no claim, in the order given; the claim's answer."""
    answer = None
    for claims in ([claim], []) if real_first else ([], [claim]):
        response = kubelet.call(kind if claims else f"{kind}_empty", claims)
        if claims:
            answer = response.claims[claim["metadata"]["uid"]]
        elif len(response.claims):
            raise RuntimeError(f"a {kind} naming no claim was answered for {len(response.claims)}")
    return answer


def _check_prepared(answer: Any, claim: dict[str, Any], specs: Any) -> None:
    uid = claim["metadata"]["uid"]
    own = f"gpu.gpufrac.io/claim={uid}-{claim['status']['allocation']['devices']['results'][0]['device']}"
    if answer.error or len(answer.devices) != 1 or own not in answer.devices[0].cdi_device_ids:
        raise RuntimeError(f"Prepare of claim {uid} answered {answer}: not the prepared claim the bench measures")
    if not specs.exists(uid) or f"NVIDIA_GPU_MEMORY_LIMIT={2 * 1024}" not in specs.path(uid).read_text():
        raise RuntimeError(f"Prepare of claim {uid} wrote no CDI spec with its limit at {specs.path(uid)}")


def _round(kubelet: Kubelet, claims: list[dict[str, Any]], specs: Any, state_file: Path) -> tuple[int, int]:
    """Prepares the round's claims, then unprepares them; (specs written, specs removed). The order of each pair
    turns every other claim of a mode (the modes alternate too)."""
    from gpufrac.agent.dra.decide import state as dra_state

    written = removed = 0
    for i, claim in enumerate(claims):
        _check_prepared(_alternated(kubelet, "prepare", claim, (i // 2) % 2 == 0), claim, specs)
        written += 1
    recorded = dra_state.load(state_file.read_text())
    if sorted(recorded) != sorted(c["metadata"]["uid"] for c in claims):
        raise RuntimeError(f"the state file records {len(recorded)} claims after the round's {len(claims)} Prepares")
    for i, claim in enumerate(claims):
        answer = _alternated(kubelet, "unprepare", claim, (i // 2) % 2 == 0)
        if answer.error or specs.exists(claim["metadata"]["uid"]):
            raise RuntimeError(f"Unprepare of claim {claim['metadata']['uid']} left its spec ({answer.error!r})")
        removed += 1
    if left := dra_state.load(state_file.read_text()):
        raise RuntimeError(f"the state file still records {len(left)} claims after the round's Unprepares")
    return written, removed


def _summary(samples: list[tuple[float, float]]) -> dict[str, float]:
    ms = sorted(wall * 1000 for wall, _ in samples)
    # nearest rank, as bench.nri_create: the smallest value with 95 % of the calls at or below it
    return {"n": len(ms), "p50_ms": statistics.median(ms), "p95_ms": ms[math.ceil(0.95 * len(ms)) - 1],
            "mean_ms": statistics.fmean(ms), "cpu_ms": 1000 * statistics.fmean(cpu for _, cpu in samples)}


def filesystem(path: Path) -> str:
    """The type of the filesystem `path` is on (its fsyncs cost what that filesystem makes them cost)."""
    best, kind = "", "unknown"
    try:
        for line in Path("/proc/self/mounts").read_text().splitlines():
            _, point, fstype, *_ = line.split()
            if (str(path) + "/").startswith(point.rstrip("/") + "/") and len(point) >= len(best):
                best, kind = point, fstype
    except OSError:
        pass
    return kind


def run(rounds: int, per_round: int, workdir: Path) -> dict[str, Any]:
    """Starts the driver's process, measures `rounds` rounds of `per_round` claims, stops it."""
    from gpufrac.agent.dra.files import ClaimSpecs

    workdir = workdir.resolve()
    if workdir.exists():
        shutil.rmtree(workdir)  # a state file from an earlier run would hold claims this run does not know
    workdir.mkdir(parents=True)
    load_before = os.getloadavg()
    claims = claims_for(rounds, per_round)
    claims_file = workdir / "claims.json"
    claims_file.write_text(json.dumps([c for batch in claims for c in batch]))
    sockets = Path(f"/tmp/gpufrac-bench-dra-{os.getpid()}")  # short: unix socket paths
    sockets.mkdir(parents=True, exist_ok=True)
    driver = kubelet = None
    try:
        driver = DriverProcess(sockets / "dra.sock", workdir / "driver", claims_file)
        kubelet = Kubelet(sockets / "dra.sock", driver)
        for kind in ("prepare", "unprepare"):
            for _ in range(WARM_UP):
                kubelet.call(kind, [], measured=False)
        cpu_before = driver.cpu_s()
        counts = [_round(kubelet, batch, ClaimSpecs(workdir / "driver" / "cdi"), workdir / "driver" / "state" /
                         "prepared.json") for batch in claims]
        cpu_run_s = driver.cpu_s() - cpu_before
    finally:
        if kubelet is not None:
            kubelet.close()
        final = driver.stop() if driver is not None else {}
        shutil.rmtree(sockets, ignore_errors=True)
    return _result(kubelet, counts, final, cpu_run_s, rounds, per_round, workdir, load_before)


def _result(kubelet: Kubelet, counts: list[tuple[int, int]], final: dict[str, Any], cpu_run_s: float, rounds: int,
            per_round: int, workdir: Path, load_before: tuple[float, float, float]) -> dict[str, Any]:
    summaries = {kind: _summary(samples) for kind, samples in kubelet.samples.items()}
    per_claim = summaries["prepare"]["cpu_ms"] + summaries["unprepare"]["cpu_ms"]
    floor = summaries["prepare_empty"]["cpu_ms"] + summaries["unprepare_empty"]["cpu_ms"]
    return {"calls": summaries, "by_mode": {mode: _summary(s) for mode, s in kubelet.by_mode.items() if s},
            "claims": rounds * per_round, "specs_written": sum(w for w, _ in counts),
            "specs_removed": sum(r for _, r in counts), "prepared_left": final.get("prepared_left"),
            "cpu_ms_per_claim": per_claim, "cpu_ms_per_claim_above_floor": per_claim - floor,
            "driver_cpu_ms_run": 1000 * cpu_run_s,  # the measured calls and what ran between them
            "driver_cpu_ms_in_calls": 1000 * sum(cpu for s in kubelet.samples.values() for _, cpu in s),
            "added_p50_ms": summaries["prepare"]["p50_ms"] - summaries["prepare_empty"]["p50_ms"],
            "rounds": rounds, "per_round": per_round, "filesystem": filesystem(workdir),
            "load_before": load_before, "load": os.getloadavg()}


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        raise SystemExit(serve_main(sys.argv[2:]))
    parser = argparse.ArgumentParser(prog="python -m bench.dra_prepare")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=40)
    parser.add_argument("--workdir", type=Path, default=ROOT / ".e2e" / "bench-dra")
    a = parser.parse_args()
    print(json.dumps(run(a.rounds, a.per_round, a.workdir), indent=2))
