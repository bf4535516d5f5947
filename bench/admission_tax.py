"""What gpufrac's admission costs the API server, per request kind (issue 34): a plain pod's CREATE, a plain pod's
status write (PUT pods/status), a fractional pod's CREATE and the binder's UPDATE, through a real kube-apiserver
(e2e.cluster.ControlPlane), with the chart's defaults (webhooks and ValidatingAdmissionPolicies), with the policies
off (the configurations rendered with policies.enabled=false, the policies and their Bindings deleted), with the
label gate on (webhook.podLabelSelector: the fractional pods carry the label, the plain ones do not; issue 47) and
with nothing installed, in alternating rounds on one control plane, of the Kubernetes version $KUBE_VERSION picks.

One client sends the requests one at a time, each kind in a phase of its own: a few unmeasured requests (the API
server compiles a re-created policy on first use, and the webhook connection is re-opened), a Go GC cycle forced in
the API server, then the measured ones, so that a phase pays for the collections of its own garbage and not of
another kind's (interleaved with the binds, a plain CREATE was charged for their garbage). The figure is the
kube-apiserver process's CPU time over a cell's blocks divided by its requests (a machine's noise moves wall time far
more than CPU time), beside the median of the phase's blocks, the p50 latency and what gpufrac's gates
(matchConditions) cost the requests they kept out, by the API server's own clock. Every request must succeed: a
refused one is counted as an error, never timed. The issue's targets are reported, not enforced.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import direct, fraction_floor, gate_floor
from bench.apiserver import (
    IMAGE,
    WEBHOOK_METRIC,
    _unbind_policies,
    _unregister,
    _webhook_names,
    histogram_series,
    serve_python,
    started_control_plane,
)
from bench.reviews import BIND_ANNOTATIONS
from e2e.toolkit.procs import free_port
from e2e.toolkit.web import https_get
from gpufrac.core.contract import FRACTIONAL_LABEL
from testkit.pods import INFERENCE, NOTEBOOK

NAMESPACE = "team-a"
BENCH_LABEL = "gpufrac-bench"  # on every pod this section makes: deleted after each setup's cells
PART_OF = "app.kubernetes.io/part-of=gpufrac"  # the chart's objects
DEFAULTS, POLICIES_OFF, LABEL_GATE, NOTHING = SETUPS = ("gpufrac defaults", "policies off", "label gate", "nothing")
# The label gate's selector (webhook.podLabelSelector) and the label the fractional pods of every setup carry.
GATE_LABELS = {"gpufrac.io/fractions": "true"}
FLOOR = gate_floor.FLOOR  # nothing installed but one empty gate per plain kind (plain kinds only)
FRACTION_FLOORS = fraction_floor.SETUPS  # nothing of gpufrac's, its additions still made (fractional CREATE only)
SEED_SHAPES = (INFERENCE, NOTEBOOK)  # the fractional pods, sent in turn
KINDS = ("plain CREATE", "plain status write", "fractional CREATE", "binder UPDATE")
PLAIN_KINDS = KINDS[:2]  # the kinds of a pod without fractions: gpufrac's gates keep them out
STATUS_POOL = 20  # plain pods whose status is written in turn
WARM_UP = 5  # unmeasured requests of each kind after each switch
# A phase's requests go in blocks of this many: one of the API server's Go GC cycles (tens of ms of CPU) lands in one
# block, and the median of the blocks leaves it out.
BLOCK = 25
PROFILING = ("--profiling=true",)  # for GC_NOW; e2e's control plane runs with profiling off
GC_NOW = "/debug/pprof/heap?gc=1"  # the Go runtime's GC, run to completion before the (discarded) heap profile
# The API server's time in matchConditions that kept a request from a webhook or policy (activation, the object
# converted for CEL, the conditions evaluated), observed only when they keep it out: gpufrac's gates on plain pods.
GATE_METRIC = "apiserver_admission_match_condition_evaluation_seconds"
IDLE_S = 2.0  # the API server's CPU at rest is read for this long at the end
MERGE_PATCH = "application/merge-patch+json"  # the binder's patch, as e2e's binder sends it (kubectl --type=merge)
# What gpufrac's mutating webhook adds, by kind: the label on a fractional CREATE, the canonical memory on the bind.
MARKS = {"plain CREATE": FRACTIONAL_LABEL, "fractional CREATE": FRACTIONAL_LABEL,
         "binder UPDATE": "gpufrac.io/container.app.gpu-memory.request-mib"}
# The targets for gpufrac's defaults by Kubernetes minor (issue 47): kind -> (the most it may cost against nothing, a
# setup to stay below). On 1.36 the plain kinds' is the empty gate's floor plus a point (the run's own floor, below).
TARGETS_BY_MINOR = {
    "1.37": {"plain CREATE": (1.05, None), "plain status write": (1.05, None), "fractional CREATE": (1.5, None),
             "binder UPDATE": (2.0, None)},
    "1.36": {"plain CREATE": (None, None), "plain status write": (None, None), "fractional CREATE": (2.0, None),
             "binder UPDATE": (2.0, None)},
}
TARGETS = TARGETS_BY_MINOR["1.37"]  # the kinds that have a target, whatever the version
_RESOURCE_VERSION = re.compile(rb'"resourceVersion":"([^"]+)"')  # the pod's own: metadata is serialized first


@dataclass
class TaxCell:
    setup: str
    kind: str
    cpu_seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    rounds: list[float] = field(default_factory=list)  # CPU ms / request of each round
    blocks: list[float] = field(default_factory=list)  # CPU ms / request of each block
    errors: int = 0
    first_error: str = ""
    mutated: int = 0  # answers carrying gpufrac's mark (MARKS) for this kind
    wrong: int = 0  # answers mutated where they should not be, or not where they should
    gate_seconds: float = 0.0  # GATE_METRIC's sum over the cell's phases
    gated: int = 0  # GATE_METRIC's count: evaluations that kept a request out
    called: int = 0  # webhook calls of the API server's (WEBHOOK_METRIC's count) over the cell's phases

    @property
    def gate_ms(self) -> float:
        """What the gates that kept this kind's requests out cost, per request."""
        return self.gate_seconds / len(self.latencies) * 1000 if self.latencies else float("nan")

    @property
    def cpu_ms(self) -> float:
        return self.cpu_seconds / len(self.latencies) * 1000 if self.latencies else float("nan")

    @property
    def block_ms(self) -> float:
        return statistics.median(self.blocks) if self.blocks else float("nan")

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies) * 1000 if self.latencies else float("nan")

    def expects_mark(self) -> bool:
        return self.kind in ("fractional CREATE", "binder UPDATE") and self.setup != NOTHING


@dataclass
class TaxResult:
    cells: dict[tuple[str, str], TaxCell]
    rounds: int
    requests: int
    server_version: str
    machine: dict[str, str]
    load_after: str
    clock: str  # which CPU clock the cells read
    clock_check: tuple[float, float] = (0.0, 0.0)  # the run's CPU seconds: (the cells' clock, /proc/<pid>/stat's)
    idle_ms_per_s: float = float("nan")  # the API server's CPU at rest, ms per second


class ThreadClock:
    """CPU seconds of one process: the sum over its threads of /proc/<pid>/task/<tid>/schedstat's first field (ns
    on a CPU), the scheduler's own count, where /proc/<pid>/stat's utime + stime move in 10 ms ticks (a cell of a
    few 2 ms requests would read 0 or 10 ms). A thread that ends keeps the time last read of it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seen: dict[str, int] = {}
        self.gone = 0  # ns of threads whose id came back with less time: a new thread

    def available(self) -> bool:
        return bool(self._read())

    def _read(self) -> dict[str, int]:
        found = {}
        for path in Path(f"/proc/{self.pid}/task").glob("*/schedstat"):
            try:
                found[path.parent.name] = int(path.read_text().split()[0])
            except (OSError, ValueError, IndexError):  # the thread ended between listing and reading
                continue
        return found

    def __call__(self) -> float:
        for tid, ns in self._read().items():
            was = self.seen.get(tid, 0)
            if ns < was:
                self.gone += was
            self.seen[tid] = ns
        return (self.gone + sum(self.seen.values())) / 1e9


class ApiserverProbe:
    """What the bench asks the API server itself, as admin, outside the measured blocks: a GC cycle now (GC_NOW), and
    GATE_METRIC's running (sum, count) from /metrics."""

    def __init__(self, cp: Any) -> None:
        self.server, self.ca_file, self.token = cp.server, cp.ca_file, cp.tokens["admin"]

    def _get(self, path: str) -> str:
        code, body = https_get(self.server + path, self.ca_file, self.token, timeout=30)
        if code != 200:
            raise RuntimeError(f"GET {path}: HTTP {code}: {body[:200]}")
        return body

    def collect_garbage(self) -> None:
        self._get(GC_NOW)

    def gates(self) -> tuple[float, int]:
        return self.admission()[:2]

    def admission(self) -> tuple[float, int, int]:
        """(GATE_METRIC's sum and count, WEBHOOK_METRIC's count): the gates' time and evaluations, the webhook calls."""
        text = self._get("/metrics")
        total, count = 0.0, 0
        for kind, _, value in histogram_series(text, GATE_METRIC):
            if kind == "sum":
                total += value
            else:
                count += int(value)
        calls = sum(int(value) for kind, _, value in histogram_series(text, WEBHOOK_METRIC) if kind == "count")
        return total, count, calls


_names = itertools.count()


def _pod(annotations: dict[str, str] | None) -> dict[str, Any]:
    """A plain pod (no annotations, no gate label), or a fractional one carrying GATE_LABELS as a cluster that
    turned the label gate on labels its fractional pods."""
    labels = {BENCH_LABEL: "1", **(GATE_LABELS if annotations else {})}
    metadata: dict[str, Any] = {"name": f"tax-{next(_names)}", "namespace": NAMESPACE, "labels": labels}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"schedulerName": "kai-scheduler",
                     "containers": [{"name": "app", "image": IMAGE, "command": ["sleep", "infinity"]}]}}


class Requests:
    """The four request kinds, each a call that sends one request and gives back the answer's bytes. The status
    writes go to a pool of plain pods, the binder's UPDATEs each to a notebook pod of its own, both made unmeasured
    by `prepare` under the setup being measured."""

    def __init__(self, api: Any, binder: Any) -> None:
        self.api = api
        self.binder = binder
        self.status_pool: list[dict[str, Any]] = []
        self.bind_pool: list[str] = []
        self._turn = itertools.count()
        self._shape = itertools.count()

    def _create(self, annotations: dict[str, str] | None, as_stored: fraction_floor.Shape | None = None) -> bytes:
        pod = _pod(annotations) if as_stored is None else as_stored.stored(_pod(annotations))
        data: bytes = self.api.create_namespaced_pod(NAMESPACE, pod, _preload_content=False).data
        return data

    def prepare(self, binds: int) -> None:
        self.status_pool = [json.loads(self._create(None)) for _ in range(STATUS_POOL)]
        self.bind_pool = [json.loads(self._create(NOTEBOOK))["metadata"]["name"] for _ in range(binds)]

    def by_kind(self) -> dict[str, Callable[[], bytes]]:
        """KINDS -> the call that sends one request of that kind."""
        return dict(zip(KINDS, (self.plain_create, self.status_write, self.fractional_create, self.binder_update),
                        strict=True))

    def plain_create(self) -> bytes:
        return self._create(None)

    def status_write(self) -> bytes:
        """A PUT of pods/status changing status.message, on the pod as the last write stored it."""
        turn = next(self._turn)
        pod = self.status_pool[turn % len(self.status_pool)]
        pod.setdefault("status", {})["message"] = f"bench {turn}"
        data: bytes = self.api.replace_namespaced_pod_status(pod["metadata"]["name"], NAMESPACE, pod,
                                                             _preload_content=False).data
        version = _RESOURCE_VERSION.search(data)
        if version:
            pod["metadata"]["resourceVersion"] = version[1].decode()
        return data

    def fractional_create(self, shapes: list[fraction_floor.Shape] | None = None) -> bytes:
        """The seed inference pod (sm-sharing, 4 GPUs) and the seed notebook (a portion of 2) in turn, as
        bench/apiserver.py sends them; with `shapes`, sent as gpufrac's admission would store them."""
        turn = next(self._shape) % len(SEED_SHAPES)
        return self._create(SEED_SHAPES[turn], shapes[turn] if shapes else None)

    def dry_runs(self) -> list[dict[str, Any]]:
        """Each seed pod as the API server would store it now (a server-side dry run, nothing stored)."""
        return [json.loads(self.api.create_namespaced_pod(NAMESPACE, _pod(annotations), dry_run="All",
                                                          _preload_content=False).data)
                for annotations in SEED_SHAPES]

    def binder_update(self) -> bytes:
        """What KAI's binder writes at bind before it posts pods/binding (e2e.testing.bind): one merge patch of the
        devices and the memory values, as the scheduler's identity (the binder's kubeconfig)."""
        data: bytes = self.binder.patch_namespaced_pod(self.bind_pool.pop(), NAMESPACE,
                                                       {"metadata": {"annotations": dict(BIND_ANNOTATIONS)}},
                                                       _content_type=MERGE_PATCH, _preload_content=False).data
        return data


def _send(cell: TaxCell, send: Callable[[], bytes]) -> None:
    started = time.perf_counter()
    try:
        data = send()
    except Exception as err:  # any refusal is counted, never timed
        cell.errors += 1
        cell.first_error = cell.first_error or " ".join(str(err).split())[:300]
        return
    cell.latencies.append(time.perf_counter() - started)
    mark = MARKS.get(cell.kind)
    if mark is not None:
        mutated = mark.encode() in data
        cell.mutated += mutated
        cell.wrong += mutated != cell.expects_mark()


def _block(cell: TaxCell, send: Callable[[], bytes], count: int, cpu: Callable[[], float]) -> tuple[float, int]:
    """`count` requests of one kind: (the API server's CPU seconds, the requests answered)."""
    answered = len(cell.latencies)
    before = cpu()
    for _ in range(count):
        _send(cell, send)
    spent, got = cpu() - before, len(cell.latencies) - answered
    cell.cpu_seconds += spent
    if got:
        cell.blocks.append(spent / got * 1000)
    return spent, got


def _phase(cell: TaxCell, send: Callable[[], bytes], count: int, cpu: Callable[[], float],
           probe: ApiserverProbe) -> None:
    """One kind's phase of a setup's round: WARM_UP unmeasured requests, a GC cycle, `count` requests in blocks."""
    for _ in range(WARM_UP):
        try:
            send()
        except Exception:  # a warm-up refusal shows again below, counted
            pass
    gate_before = probe.admission()  # before the GC: reading /metrics leaves garbage of its own
    probe.collect_garbage()
    spent, got = 0.0, 0
    for start in range(0, count, BLOCK):
        block_spent, block_got = _block(cell, send, min(BLOCK, count - start), cpu)
        spent, got = spent + block_spent, got + block_got
    gate_after = probe.admission()
    cell.gate_seconds += gate_after[0] - gate_before[0]
    cell.gated += gate_after[1] - gate_before[1]
    cell.called += gate_after[2] - gate_before[2]
    if got:
        cell.rounds.append(spent / got * 1000)


def _floor_phases(cells: dict[tuple[str, str], TaxCell], requests: Requests, admission_api: Any, count: int,
                  cpu: Callable[[], float], probe: ApiserverProbe) -> None:
    """Right after nothing's phases, with nothing installed: the plain kinds again, each meeting one empty gate
    (bench/gate_floor.py), the least any gate that reads annotations costs."""
    plain = {kind: send for kind, send in requests.by_kind().items() if kind in PLAIN_KINDS}
    gate_floor.install(admission_api, probe.gates, requests.plain_create, requests.status_write)
    try:
        for kind, send in plain.items():
            _phase(cells.setdefault((FLOOR, kind), TaxCell(FLOOR, kind)), send, count, cpu, probe)
    finally:
        gate_floor.remove(admission_api, probe.gates, requests.plain_create, requests.status_write)


def _serve_constant(cp: Any, variants: dict[str, list[fraction_floor.Shape]]) -> tuple[direct.Server, str]:
    """bench.constant_app serving `variants` on a port of its own with the webhook's certificates, and its URL."""
    workdir = cp.workdir / "constant-webhook"
    workdir.mkdir(exist_ok=True)
    answers = workdir / "answers.json"
    answers.write_text(fraction_floor.answers(variants))
    port = free_port()
    server = serve_python(fraction_floor.WEBHOOK, "bench.constant_app", cp.webhook_certs, port, workdir,
                          ("--answers", str(answers)))
    return server, f"https://127.0.0.1:{port}"


def _fraction_floor_phases(cells: dict[tuple[str, str], TaxCell], requests: Requests, cp: Any, admission_api: Any,
                           count: int, cpu: Callable[[], float], probe: ApiserverProbe,
                           dry_runs: dict[str, list[dict[str, Any]]]) -> None:
    """Right after nothing's phases, with nothing installed: the fractional CREATE with gpufrac's additions made
    without it (bench/fraction_floor.py), all of them, then the metadata alone, each sent by the client, then written
    by the constant policy, then by the constant webhook. `dry_runs`: the seed pods as the defaults and nothing
    store them."""
    kind = "fractional CREATE"

    def stored_as(pods: list[dict[str, Any]]) -> Callable[[], bool]:
        """Whether a dry run of each seed pod now comes back as `pods` (an admission applied, or gone)."""
        return lambda: all(fraction_floor.same_but_token(now, then)
                           for now, then in zip(requests.dry_runs(), pods, strict=True))

    def measure(setup: str, send: Callable[[], bytes]) -> None:
        _phase(cells.setdefault((setup, kind), TaxCell(setup, kind)), send, count, cpu, probe)

    whole = [fraction_floor.shape(annotations, plain_pod, mutated) for annotations, plain_pod, mutated
             in zip(SEED_SHAPES, dry_runs[NOTHING], dry_runs[DEFAULTS], strict=True)]
    variants = fraction_floor.variants(whole)
    selector, unchanged = {BENCH_LABEL: "1"}, stored_as(dry_runs[NOTHING])
    ca_bundle = base64.b64encode((cp.webhook_certs / "ca.crt").read_bytes()).decode()
    constant, url = _serve_constant(cp, variants)
    try:
        for variant, (sent, policy, webhook) in fraction_floor.VARIANTS.items():
            shapes = variants[variant]
            measure(sent, lambda shapes=shapes: requests.fractional_create(shapes))
            applied = stored_as([shape.stored(pod) for shape, pod in zip(shapes, dry_runs[NOTHING], strict=True)])
            fraction_floor.install_policy(admission_api, shapes, selector, applied)
            try:
                measure(policy, requests.fractional_create)
            finally:
                fraction_floor.remove_policy(admission_api, unchanged)
            configuration = fraction_floor.webhook_configuration(f"{url}/mutate/{variant}", ca_bundle, selector)
            fraction_floor.install_webhook(admission_api, configuration, applied)
            try:
                measure(webhook, requests.fractional_create)
            finally:
                fraction_floor.remove_webhook(admission_api, unchanged)
    finally:
        constant.stop()


def _remove_policies(cp: Any, admission_api: Any) -> None:
    """The policies' Bindings deleted (waiting until the API server stops applying them), then the policies: what
    the chart leaves with policies.enabled=false."""
    _unbind_policies(cp, admission_api)
    for policy in admission_api.list_validating_admission_policy(label_selector=PART_OF).items:
        admission_api.delete_validating_admission_policy(policy.metadata.name)


def _switch(setup: str, cp: Any, admission_api: Any, api: Any, names: list[tuple[str, str]]) -> None:
    cp.policies = setup in (DEFAULTS, LABEL_GATE)
    if setup == NOTHING:
        _unregister(cp, admission_api, api, names)  # waits until a pod is no longer mutated
    else:  # re-creates what is missing; waits until pods are mutated (and, with the policies, they apply)
        cp.apply_webhook_configurations(gate_labels=GATE_LABELS if setup == LABEL_GATE else None)
    if not cp.policies:
        _remove_policies(cp, admission_api)
    time.sleep(2)  # the validating configuration comes by its own informer


def _round(r: int, cells: dict[tuple[str, str], TaxCell], clients: tuple[Any, Any], cp: Any, admission_api: Any,
           names: list[tuple[str, str]], count: int, cpu: Callable[[], float], probe: ApiserverProbe,
           dry_runs: dict[str, list[dict[str, Any]]]) -> None:
    api, binder = clients
    turn = r % len(SETUPS)
    order = SETUPS[turn:] + SETUPS[:turn]  # rotate: no setup always comes first, none comes twice in a row
    for setup in order:
        _switch(setup, cp, admission_api, api, names)
        requests = Requests(api, binder)
        requests.prepare(WARM_UP + count)
        measured = [cells.setdefault((setup, kind), TaxCell(setup, kind)) for kind in KINDS]
        for cell, send in zip(measured, requests.by_kind().values(), strict=True):
            _phase(cell, send, count, cpu, probe)
        if setup in (DEFAULTS, NOTHING) and setup not in dry_runs:  # round 1, defaults first: the fraction floors'
            dry_runs[setup] = requests.dry_runs()
        if setup == NOTHING:
            _floor_phases(cells, requests, admission_api, count, cpu, probe)
            _fraction_floor_phases(cells, requests, cp, admission_api, count, cpu, probe, dry_runs)
        print(f"[bench] tax round {r + 1} {setup}: " + ", ".join(
            f"{c.kind} {c.rounds[-1] if c.rounds else float('nan'):.2f} ms" for c in measured), file=sys.stderr,
            flush=True)
        api.delete_collection_namespaced_pod(NAMESPACE, label_selector=BENCH_LABEL, grace_period_seconds=0)


def _idle_ms_per_s(cpu: Callable[[], float], seconds: float) -> float:
    before, started = cpu(), time.monotonic()
    time.sleep(seconds)
    return (cpu() - before) / (time.monotonic() - started) * 1000


def run(*, requests: int, rounds: int, workdir: Path, idle_s: float = IDLE_S) -> TaxResult | str:
    """`requests` measured per cell and round, after WARM_UP unmeasured ones."""
    from kubernetes import client, config

    from bench import machine

    cp = started_control_plane(workdir, PROFILING)
    if isinstance(cp, str):
        return cp
    try:
        def api_for(user: str) -> Any:
            configuration = client.Configuration()
            config.load_kube_config(config_file=str(cp.kubeconfigs[user]), client_configuration=configuration)
            return client.ApiClient(configuration)

        admin = api_for("admin")
        api, binder = client.CoreV1Api(admin), client.CoreV1Api(api_for("binder"))
        admission_api = client.AdmissionregistrationV1Api(admin)
        names = _webhook_names(cp.workdir / "webhook-configurations.yaml")
        proc = cp.procs["kube-apiserver"]
        fine = ThreadClock(proc.pid)
        cpu, clock = (fine, "schedstat") if fine.available() else (proc.cpu_seconds, "stat")
        described = machine.describe()
        cells: dict[tuple[str, str], TaxCell] = {}
        started = (cpu(), proc.cpu_seconds())
        probe = ApiserverProbe(cp)
        dry_runs: dict[str, list[dict[str, Any]]] = {}  # setup -> the seed pods as it stores them
        for r in range(rounds):
            _round(r, cells, (api, binder), cp, admission_api, names, requests, cpu, probe, dry_runs)
        check = (cpu() - started[0], proc.cpu_seconds() - started[1])
        return TaxResult(cells, rounds, requests, cp.server_version, described, machine.load_average(), clock,
                         check, _idle_ms_per_s(cpu, idle_s))
    finally:
        cp.stop()


def _ratio(cell: TaxCell, base: TaxCell | None, figure: str = "cpu_ms") -> float:
    value, of = getattr(cell, figure), getattr(base, figure, float("nan"))
    return float(value / of) if of else float("nan")


def minor(server_version: str) -> str:
    """"v1.37.2" -> "1.37" (the key of TARGETS_BY_MINOR); "" where the version cannot be read."""
    found = re.match(r"v?(\d+\.\d+)", server_version)
    return found[1] if found else ""


def targets(result: TaxResult) -> dict[str, tuple[float, str | None]]:
    """kind -> (the most gpufrac's defaults may cost against nothing, a setup to stay below) on the run's version:
    1.37's where the version is another; on 1.36 the plain kinds may cost the run's own empty gate plus a point."""
    chosen = TARGETS_BY_MINOR.get(minor(result.server_version), TARGETS)
    out: dict[str, tuple[float, str | None]] = {}
    for kind, (most, below) in chosen.items():
        if most is None:  # the floor plus a point, as the run measured it
            floor, nothing = result.cells.get((FLOOR, kind)), result.cells.get((NOTHING, kind))
            most = (_ratio(floor, nothing) if floor else 1.0) + 0.01
        out[kind] = (most, below)
    return out


def _met(result: TaxResult, kind: str, figure: str, target: tuple[float, str | None]) -> bool:
    most, below = target
    defaults = result.cells[(DEFAULTS, kind)]
    met = _ratio(defaults, result.cells[(NOTHING, kind)], figure) <= most
    return met and (below is None or getattr(defaults, figure) < getattr(result.cells[(below, kind)], figure))


def target_rows(result: TaxResult) -> dict[str, tuple[str, bool, bool]]:
    """kind -> (the target for gpufrac's defaults on the run's Kubernetes version, in words; met by the CPU per
    request; met by the blocks' median)."""
    rows = {}
    for kind, target in targets(result).items():
        most, below = target
        words = f"≤ {most:g}× nothing" if most >= 1.5 else f"≤ +{(most - 1) * 100:.3g} % of nothing"
        rows[kind] = (words + (f", < {below}" if below else ""), _met(result, kind, "cpu_ms", target),
                      _met(result, kind, "block_ms", target))
    return rows


def _verdict(target: tuple[str, bool, bool] | None) -> tuple[str, str]:
    if target is None:
        return "", ""
    words, met, by_median = target
    shown = "yes" if met else "**no**"
    return words, shown if met == by_median else f"{shown} (median: {'yes' if by_median else 'no'})"


def _row(cell: TaxCell, nothing: TaxCell | None, target: tuple[str, bool, bool] | None, version: str) -> str:
    spread = f"{min(cell.rounds):.2f}–{max(cell.rounds):.2f}" if len(cell.rounds) > 1 else ""
    errors = f"{cell.errors} ({cell.first_error[:80]})" if cell.errors else "0"
    if cell.wrong:
        errors += f", {cell.wrong} mutated wrongly"
    extra = "" if nothing is None or cell is nothing else f"{cell.p50_ms - nothing.p50_ms:+.1f}"
    words, shown = _verdict(target)
    return (f"| {cell.kind} | {cell.setup} | {version} | {cell.cpu_ms:.2f} | {spread} | {_ratio(cell, nothing):.2f} | "
            f"{cell.block_ms:.2f} ({len(cell.blocks)}) | {_ratio(cell, nothing, 'block_ms'):.2f} | "
            f"{cell.p50_ms:.1f} | {extra} | {cell.gate_ms * 1000:.0f} ({cell.gated}) | {cell.called} | {errors} | "
            f"{words} | {shown} |")


def _gate_line(result: TaxResult) -> str:
    """What gpufrac's gates cost a plain request under its defaults, beside that request's whole CPU with nothing
    installed: the part of the plain kinds' tax the API server itself times, free of the run's noise."""
    parts = []
    for kind in PLAIN_KINDS:
        cell, nothing, floor = (result.cells[(setup, kind)] for setup in (DEFAULTS, NOTHING, FLOOR))
        parts.append(f"{kind} {cell.gate_ms * 1000:.0f} µs ({cell.gate_ms / nothing.cpu_ms * 100:.1f} % of its "
                     f"{nothing.cpu_ms:.2f} ms with nothing installed; {FLOOR}, one condition `false`: "
                     f"{floor.gate_ms * 1000:.0f} µs, {floor.gate_ms / nothing.cpu_ms * 100:.1f} %)")
    return "gpufrac's gates, by the API server's own clock, per plain request under the defaults: " + "; ".join(
        parts) + "."


def _fraction_floor_line(result: TaxResult) -> str:
    """A fractional CREATE's cost with gpufrac's additions made without gpufrac: sent, or written by the cheapest
    policy or webhook (bench/fraction_floor.py), beside the defaults' and the target."""
    kind = "fractional CREATE"
    nothing = result.cells[(NOTHING, kind)]
    floors = [result.cells[(setup, kind)] for setup in FRACTION_FLOORS]
    most = targets(result)[kind][0]
    parts = [f"{cell.setup} ×{_ratio(cell, nothing):.2f} (median of blocks ×{_ratio(cell, nothing, 'block_ms'):.2f})"
             for cell in (*floors, result.cells[(DEFAULTS, kind)])]
    return (f"A {kind} with gpufrac's additions (label, canonical annotations, node affinity, env, MPS mounts, CSI "
            f"volume; {fraction_floor.METADATA}: label, annotations and node affinity alone) made without gpufrac, "
            f"Kubernetes {result.server_version}, × nothing: " + "; ".join(parts)
            + f". Target for {DEFAULTS}: ≤ {most:g}×.")


def _label_gate_line(result: TaxResult) -> str:
    """What the label gate leaves a plain (unlabelled) pod to pay: no gate evaluated, no webhook called."""
    parts = []
    for kind in PLAIN_KINDS:
        cell, nothing = result.cells[(LABEL_GATE, kind)], result.cells[(NOTHING, kind)]
        parts.append(f"{kind} {cell.gated} gate evaluations and {cell.called} webhook calls for {len(cell.latencies)} "
                     f"requests, {cell.cpu_ms:.2f} ms against nothing's {nothing.cpu_ms:.2f} ms "
                     f"(×{_ratio(cell, nothing):.2f})")
    return (f"{LABEL_GATE} ({', '.join(f'{k}={v}' for k, v in GATE_LABELS.items())} selects; plain pods unlabelled), "
            f"Kubernetes {result.server_version}: " + "; ".join(parts) + ".")


def _mutation_line(result: TaxResult) -> str:
    parts = []
    for kind in ("fractional CREATE", "binder UPDATE"):
        counts = [f"{setup} {result.cells[(setup, kind)].mutated}/{len(result.cells[(setup, kind)].latencies)}"
                  for setup in SETUPS]
        parts.append(f"{kind}s marked by gpufrac's mutating webhook ({MARKS[kind]}): " + ", ".join(counts))
    return "; ".join(parts) + "."


def _header(result: TaxResult) -> list[str]:
    m = result.machine
    clock = ("the sum over its threads of /proc/<pid>/task/*/schedstat (ns)" if result.clock == "schedstat"
             else "utime + stime from /proc/<pid>/stat (10 ms ticks)")
    fine, ticks = result.clock_check
    return [f"kube-apiserver {result.server_version} + etcd (e2e.cluster.ControlPlane), one client sending one request "
            f"at a time; {result.rounds} round(s) of {result.requests} requests per cell after {WARM_UP} unmeasured "
            f"ones, the setups in turn (rotated each round). {m['date']} · {m['cpu']} · load average "
            f"{m['load']} before, {result.load_after} after.", "",
            f"CPU: the kube-apiserver process's, {clock}, over the cell ÷ its requests (the run: {fine:.2f} s; "
            f"/proc/<pid>/stat: {ticks:.2f} s). At rest it spends {result.idle_ms_per_s:.1f} ms of CPU a second, "
            "counted in every cell by its wall time. gpufrac defaults = the chart's webhook configurations, "
            "ValidatingAdmissionPolicies and Bindings; policies off = the configurations rendered with "
            "policies.enabled=false, the policies deleted; nothing = all deleted; an empty gate = nothing but one "
            "mutating webhook (pods CREATE) and one bound policy (pods/status), each with the one condition `false` "
            f"(bench/gate_floor.py), plain kinds only, measured after nothing; {fraction_floor.STORED}, "
            f"{fraction_floor.POLICY} and {fraction_floor.WEBHOOK} = nothing of gpufrac's, its additions to each "
            "seed pod (taken from a dry run under the defaults) sent by the client, or written as a constant JSON "
            "patch by one MutatingAdmissionPolicy or by one webhook that decides nothing (bench/constant_app.py), "
            "fractional CREATE only, measured after nothing. Status write: PUT "
            "pods/status (status.message); binder UPDATE: a merge patch of the bind-time annotations as "
            "system:serviceaccount:kai-scheduler:binder. Each kind of a setup's round is a phase of its own, begun "
            f"with a GC cycle forced in the API server ({GC_NOW}, profiling on): a phase pays for the collections "
            "of its own garbage, not of another kind's. Its requests go in blocks of "
            f"{BLOCK}: the median of the blocks leaves out the blocks an API server GC cycle landed in (the mean "
            "counts them; few cycles fall in a short run, so the mean moves round to round). Gates: the API "
            f"server's own time in the matchConditions that kept the kind's requests out ({GATE_METRIC}: the CEL "
            "activation, the object converted, the conditions), µs per request (evaluations). Targets (the "
            "issue's, for gpufrac defaults; reported, not enforced) beside each kind's defaults row, met? by the "
            "mean.", ""]


def markdown(result: TaxResult | str | None) -> str:
    if result is None:
        return ""
    lines = ["## Admission's cost to the API server, per request (issues 34, 47)", ""]
    if isinstance(result, str):
        return "\n".join([*lines, result])
    lines += _header(result)
    lines += ["| request | setup | Kubernetes | API server CPU ms / request | rounds (min–max) | × nothing | median of "
              "blocks (blocks) | median × nothing | p50 ms | p50 − nothing ms | gates µs (kept out) | webhook calls | "
              "errors | target | met? |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = target_rows(result)
    for kind in KINDS:
        nothing = result.cells.get((NOTHING, kind))
        for setup in (*SETUPS, FLOOR, *FRACTION_FLOORS):
            if (setup, kind) in result.cells:
                cell = result.cells[(setup, kind)]
                lines.append(_row(cell, nothing, rows.get(kind) if setup == DEFAULTS else None,
                                  result.server_version))
    return "\n".join([*lines, "", _gate_line(result), "", _fraction_floor_line(result), "", _label_gate_line(result),
                      "", _mutation_line(result)])


if __name__ == "__main__":  # a quick look: python -m bench.admission_tax
    print(markdown(run(requests=50, rounds=1, workdir=Path(".e2e/bench-tax"))))
