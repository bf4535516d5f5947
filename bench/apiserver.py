"""Admission through a real kube-apiserver (e2e.cluster.ControlPlane): pod creates per second and create latency
with gpufrac's two webhook configurations registered and served by gpufrac; the same configurations served, on the
same port with the same certificates, by stand-ins: gpufrac's own answers replayed (bench.replay_app: the same
patches, no work per review), the do-nothing webhook (bench.noop_app, same gunicorn settings) and a do-nothing
webhook in Go (bench/go_noop, net/http as KAI's webhook uses; built with the Go toolchain the harness builds
Kubernetes with, skipped without one); and with them deleted (same pods, same client). gpufrac − replayed is what
gpufrac's work per review costs a user, replayed − do-nothing what its patches cost the API server, do-nothing (Go)
− none what two webhook calls cost on this machine whatever serves them."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench import direct
from bench.chart import ROOT
from bench.reviews import INFERENCE, NOTEBOOK
from e2e.toolkit.wait import wait_until
from gpufrac.core.contract import FRACTIONAL_LABEL

NAMESPACE = "team-a"
IMAGE = "nvcr.io/nvidia/cuda:13.0.2-base-ubuntu24.04"
# Who answers the registered configurations in a cell; "none": the configurations are deleted. "gpufrac +
# policies": the chart's default, policies.enabled: its ValidatingAdmissionPolicies bound too, and a pod's CREATE
# judged by the mutating webhook alone (it fails closed: neither the validating webhook nor a policy evaluates it).
# Every other cell runs the configurations rendered with policies.enabled=false (the validating webhook called on
# CREATE) and the policies' Bindings deleted.
POLICIES = "gpufrac + policies"
SERVERS = (POLICIES, "gpufrac", "gpufrac's answers replayed", "do-nothing", "do-nothing (Go)", "none")
MUTATING = (POLICIES, "gpufrac", "gpufrac's answers replayed")  # the servers whose pods come back labelled
CPU_PARTS = ("kube-apiserver", "webhook")  # whose CPU a cell counts per pod (the webhook: whoever serves it)
PYTHON_STAND_INS = {"gpufrac's answers replayed": "bench.replay_app", "do-nothing": "bench.noop_app"}
GO_NOOP = ROOT / "bench" / "go_noop"


@dataclass
class ApiCell:
    webhooks: str  # one of SERVERS
    concurrency: int
    latencies: list[float] = field(default_factory=list)  # seconds
    seconds: float = 0.0
    errors: int = 0
    first_error: str = ""
    wrong: int = 0  # created but mutated when it should not be, or the reverse
    # webhook name -> [seconds, calls] as the API server times its calls to it (request sent to answer read)
    webhook_calls: dict[str, list[float]] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)  # CPU_PARTS -> user + system seconds in the cell

    def cpu_ms_per_pod(self, part: str) -> float:
        seconds = self.cpu_seconds.get(part)
        return seconds / len(self.latencies) * 1000 if seconds is not None and self.latencies else float("nan")

    def webhook_ms(self, name: str) -> float:
        seconds, calls = self.webhook_calls.get(name, (0.0, 0))
        return seconds / calls * 1000 if calls else float("nan")

    @property
    def pods_per_s(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        values = sorted(self.latencies)
        return values[min(len(values) - 1, int(q * (len(values) - 1)))] * 1000 if values else float("nan")


@dataclass
class ApiResult:
    cells: dict[tuple[str, int], ApiCell]
    server_version: str
    duration: float
    skipped: dict[str, str]  # server -> why it has no cells
    rounds: int
    cold_start_s: float
    webhook_names: list[tuple[str, str]]


_counter = itertools.count()


def _manifest(i: int) -> dict:
    annotations = INFERENCE if i % 2 == 0 else NOTEBOOK
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"bench-{i}", "namespace": NAMESPACE, "annotations": dict(annotations)},
            "spec": {"schedulerName": "kai-scheduler",
                     "containers": [{"name": "app", "image": IMAGE, "command": ["sleep", "infinity"]}]}}


WEBHOOK_METRIC = "apiserver_admission_webhook_admission_duration_seconds"
_NAME_LABEL = re.compile(r'name="([^"]*)"')


def histogram_series(text: str, metric: str) -> list[tuple[str, str, float]]:
    """("sum" or "count", its labels, its value) of each series of the histogram `metric` in a /metrics text."""
    series = re.compile(rf'^{re.escape(metric)}_(sum|count)(?:\{{([^}}]*)\}})? (\S+)$', re.M)
    return [(kind, labels, float(value)) for kind, labels, value in series.findall(text)]


def _webhook_seconds(api_client) -> dict[str, list[float]]:
    """webhook name -> [seconds, calls] so far, from the API server's own metrics."""
    method, url, headers, body, _ = api_client.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    text = api_client.call_api(method, url, header_params=headers, body=body).read().decode()
    totals: dict[str, list[float]] = {}
    for kind, labels, value in histogram_series(text, WEBHOOK_METRIC):
        name = _NAME_LABEL.search(labels)
        if name:
            totals.setdefault(name[1], [0.0, 0.0])[0 if kind == "sum" else 1] += value
    return totals


def _load(cell: ApiCell, api, duration: float, run_tag: str) -> None:
    deadline = time.monotonic() + duration
    lock = threading.Lock()

    def worker() -> None:
        while time.monotonic() < deadline:
            i = next(_counter)
            body = _manifest(i)
            body["metadata"]["name"] = f"bench-{run_tag}-{i}"
            t0 = time.perf_counter()
            try:
                resp = api.create_namespaced_pod(NAMESPACE, body, _preload_content=False)
                data = resp.data
                elapsed = time.perf_counter() - t0
            except Exception as err:  # any API error is counted, never hidden
                with lock:
                    cell.errors += 1
                    cell.first_error = cell.first_error or " ".join(str(err).split())[:300]
                continue
            labelled = FRACTIONAL_LABEL.encode() in data
            with lock:
                cell.latencies.append(elapsed)
                if labelled != (cell.webhooks in MUTATING):
                    cell.wrong += 1

    threads = [threading.Thread(target=worker) for _ in range(cell.concurrency)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cell.seconds += time.monotonic() - start


def _webhook_names(manifest: Path) -> list[tuple[str, str]]:
    return [(doc["kind"], doc["metadata"]["name"]) for doc in yaml.safe_load_all(manifest.read_text())
            if doc and doc.get("kind", "").endswith("WebhookConfiguration")]


def _mutated_on_dry_run(api) -> bool:
    """True while a dry-run fractional pod comes back mutated, or is denied (the validating webhook still
    registered after the mutating one is gone); False once it is stored as sent."""
    from kubernetes.client.exceptions import ApiException

    body = _manifest(0)
    body["metadata"]["name"] = "bench-probe"
    try:
        resp = api.create_namespaced_pod(NAMESPACE, body, dry_run="All", _preload_content=False)
    except ApiException as err:
        if err.status == 403 and "gpufrac.io" in str(err.body):
            return True
        raise
    return FRACTIONAL_LABEL.encode() in resp.data


def _unregister(cp, admission_api, api, names: list[tuple[str, str]], timeout: float = 30) -> None:
    for kind, name in names:
        if kind == "MutatingWebhookConfiguration":
            admission_api.delete_mutating_webhook_configuration(name)
        else:
            admission_api.delete_validating_webhook_configuration(name)
    # The API server drops webhooks from an informer: wait until it has.
    wait_until(lambda: not _mutated_on_dry_run(api), timeout, "pods to be no longer mutated", interval=0.2)


def go_do_nothing_binary() -> Path | str:
    """bench/go_noop built once per source into the tools cache; a reason string when there is no Go toolchain or
    the build fails."""
    from e2e.toolkit.tools import tools_cache

    go = shutil.which("go")
    if go is None:
        return "no Go toolchain on PATH"
    digest = hashlib.sha256(b"".join((GO_NOOP / f).read_bytes() for f in ("go.mod", "main.go"))).hexdigest()[:12]
    binary = tools_cache() / "bin" / f"bench-go-noop-{digest}"
    if binary.exists():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-buildvcs=false", "CGO_ENABLED": "0"}
    result = subprocess.run([go, "build", "-o", f"{binary}.tmp", "."], cwd=GO_NOOP, env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    if result.returncode != 0:
        return f"go build of bench/go_noop failed: {result.stderr.strip()[-300:]}"
    os.replace(f"{binary}.tmp", binary)
    return binary


def _serve_stand_in(cp, workdir: Path, server: str, go_binary: Path | None) -> direct.Server:
    """Stop gpufrac's webhook and serve a stand-in on its port with its certificates: a Python one
    (PYTHON_STAND_INS) with the settings `gpufrac webhook` runs with by default (the control plane's webhook), or
    the Go one."""
    cp.stop_webhook()
    port = cp.ports["webhook"]
    workdir.mkdir(parents=True, exist_ok=True)
    if server == "do-nothing (Go)" and go_binary is not None:
        return direct.start(server, [str(go_binary), str(cp.webhook_certs), f"127.0.0.1:{port}"],
                            workdir / "go-do-nothing.log", dict(os.environ), port)
    return serve_python(server, PYTHON_STAND_INS[server], cp.webhook_certs, port, workdir)


def serve_python(name: str, module: str, certs: Path, port: int, workdir: Path,
                 args: tuple[str, ...] = ()) -> direct.Server:
    """`python -m module` (noop_app.serve's command line, `args` first) on `port` with `certs`, with the settings
    `gpufrac webhook` runs with by default."""
    from gpufrac.webhook.serve.server import ServeOptions

    defaults = ServeOptions(certs, "")
    run_dir = workdir / f"{module}-run"
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_RUNTIME_DIR": str(run_dir),
           "PROMETHEUS_MULTIPROC_DIR": str(workdir / f"{module}-prometheus"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    argv = [sys.executable, "-m", module, *args, "--workers", str(defaults.workers), "--threads",
            str(defaults.threads), "--certs", str(certs), "--bind", f"127.0.0.1:{port}"]
    return direct.start(name, argv, workdir / f"{module}.log", env, port)


def _unbind_policies(cp, admission_api, timeout: float = 30) -> None:
    """Delete the chart's policy Bindings and wait until the API server stops applying them (e2e's policy probe: an
    UPDATE only a policy denies first; a CREATE would not do where the mutating webhook judges it alone)."""
    from e2e.webhook_configurations import POLICY_DENIED, policy_probe

    for binding in admission_api.list_validating_admission_policy_binding(
            label_selector="app.kubernetes.io/part-of=gpufrac").items:
        admission_api.delete_validating_admission_policy_binding(binding.metadata.name)
    admin = functools.partial(cp.kubectl, user="admin")
    wait_until(lambda: POLICY_DENIED not in policy_probe(admin).stderr, timeout,
               "the policies to be no longer applied", interval=0.2)


def _measure(cell: ApiCell, api, api_client, duration: float, run_tag: str,
             cpu: dict[str, object] | None = None) -> None:
    """One cell's load; `cpu`: CPU_PARTS -> a callable giving that part's CPU seconds so far."""
    before = _webhook_seconds(api_client)
    cpu_before = {part: read() for part, read in (cpu or {}).items()}  # type: ignore[operator]
    _load(cell, api, duration, run_tag)
    for part, read in (cpu or {}).items():
        cell.cpu_seconds[part] = cell.cpu_seconds.get(part, 0.0) + read() - cpu_before[part]  # type: ignore[operator]
    for name, (seconds, calls) in _webhook_seconds(api_client).items():
        was = before.get(name, [0.0, 0.0])
        total = cell.webhook_calls.setdefault(name, [0.0, 0])
        total[0] += seconds - was[0]
        total[1] += int(calls - was[1])
    print(f"[bench] apiserver webhooks={cell.webhooks:<10s} c={cell.concurrency:<3d} {cell.pods_per_s:6.1f} pods/s "
          f"p99 {cell.pct(0.99):.1f} ms", file=sys.stderr, flush=True)


def _switch_to(server: str, r: int, cp, admission_api, api, names: list[tuple[str, str]], stand_ins: Path,
               go_binary: Path | None, clients: int) -> direct.Server | None:
    """Put `server` behind the registered configurations for round `r`: the stand-in it started, if any."""
    if server == POLICIES:
        if r > 0:  # gpufrac's server is up again since the last "none"; the start registered them
            cp.policies = True
            cp.apply_webhook_configurations()  # waits until a dry-run pod is mutated and policies apply
            time.sleep(2)  # and the validating configuration, loaded by its own informer
        return None
    if server == "gpufrac":
        cp.policies = False
        cp.apply_webhook_configurations()  # the validating webhook called on CREATE again
        _unbind_policies(cp, admission_api)
        time.sleep(2)
        return None
    if server == "none":
        cp.start_webhook()  # gpufrac's again: the configurations are deleted, then re-added, with it
        _unregister(cp, admission_api, api, names)
        return None
    stand_in = _serve_stand_in(cp, stand_ins, server, go_binary)
    # The API server's kept-alive connections went with the server before: reconnect, uncounted.
    _load(ApiCell(server, clients), api, 1.0, f"warm-r{r}")
    return stand_in


def started_control_plane(workdir: Path, apiserver_flags: tuple[str, ...] = ()) -> Any:
    """A ControlPlane started in `workdir` (with `apiserver_flags` added to kube-apiserver's), or why there is none
    ("skipped: ...")."""
    try:
        from e2e.cluster import ControlPlane
        from e2e.toolkit.errors import ToolsMissingError
    except ImportError as err:
        return f"skipped: e2e.cluster is not importable ({err})"
    try:
        return ControlPlane(workdir, quiet=True, apiserver_flags=apiserver_flags).start()
    except ToolsMissingError as err:
        return f"skipped: {err}"


def run(*, concurrencies: tuple[int, ...], duration: float, rounds: int, workdir: Path) -> ApiResult | str:
    from kubernetes import client, config

    cp = started_control_plane(workdir)
    if isinstance(cp, str):
        return cp
    try:
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(cp.kubeconfigs["admin"]), client_configuration=configuration)
        configuration.connection_pool_maxsize = max(concurrencies) + 4
        api_client = client.ApiClient(configuration)
        api = client.CoreV1Api(api_client)
        admission_api = client.AdmissionregistrationV1Api(api_client)
        names = _webhook_names(cp.workdir / "webhook-configurations.yaml")
        if not _mutated_on_dry_run(api):
            raise RuntimeError("the webhooks are registered but a dry-run pod is not mutated")
        # Warm the client's connection pool, the API server and the webhook.
        _load(ApiCell("gpufrac", max(concurrencies)), api, 1.0, "warm")
        cells: dict[tuple[str, int], ApiCell] = {}
        go_binary = go_do_nothing_binary()
        skipped = {} if isinstance(go_binary, Path) else {"do-nothing (Go)": go_binary}
        for r in range(rounds):
            for server in SERVERS:
                if server in skipped:
                    continue
                stand_in = _switch_to(server, r, cp, admission_api, api, names, workdir / f"stand-ins-{r}",
                                      go_binary if isinstance(go_binary, Path) else None, max(concurrencies))
                webhook_proc = stand_in.proc if stand_in is not None else cp.procs.get("webhook")
                cpu = {"kube-apiserver": cp.procs["kube-apiserver"].cpu_seconds}
                if server != "none" and webhook_proc is not None:
                    cpu["webhook"] = webhook_proc.cpu_seconds
                try:
                    for concurrency in concurrencies:
                        cell = cells.setdefault((server, concurrency), ApiCell(server, concurrency))
                        _measure(cell, api, api_client, duration, f"r{r}-s{SERVERS.index(server)}-c{concurrency}",
                                 cpu)
                finally:
                    if stand_in is not None:
                        stand_in.stop()
        return ApiResult(cells, cp.server_version, duration, skipped, rounds, cp.timings.get("cold_start_s", 0.0),
                         names)
    finally:
        cp.stop()


def summary(cell: ApiCell) -> dict[str, float]:
    return {"pods": len(cell.latencies), "pods_per_s": cell.pods_per_s,
            "p50_ms": statistics.median(cell.latencies) * 1000 if cell.latencies else float("nan"),
            "p99_ms": cell.pct(0.99), **{f"{part}_cpu_ms_per_pod": cell.cpu_ms_per_pod(part) for part in CPU_PARTS}}


if __name__ == "__main__":  # a quick look: python -m bench.apiserver
    result = run(concurrencies=(1, 4), duration=2, rounds=1, workdir=Path(".e2e/bench"))
    print(result if isinstance(result, str) else json.dumps(
        {f"{k[0]}-c{k[1]}": summary(c) for k, c in result.cells.items()}, indent=1))
