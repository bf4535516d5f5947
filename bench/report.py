"""One Markdown report from the sections' results."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from bench.apiserver import POLICIES, SERVERS, ApiCell, ApiResult
from bench.chart import ChartWebhook
from bench.direct import Cell, HttpResult
from bench.inprocess import SeedRow, SizeRow
from bench.reviews import POD_CREATE, SeedReview

TARGET_HANDLER_P99_MS = 2.0
TARGET_E2E_P99_MS = 10.0
TARGET_RATIO = 0.70
TARGET_CONCURRENCY = 32
TARGET_POD_CREATE_CPU_MS = 1.6  # mutate + validate of the seed inference pod, server CPU
TARGET_ABOVE_NOTHING_MS = 0.2  # gpufrac's server CPU per review above the do-nothing webhook's
TARGET_PSS_MIB = 100.0  # per replica, under load
TARGET_ADDED_P50_MS = 3.0  # what gpufrac's webhooks add to a pod CREATE through the API server, 1 client


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1)))] if ordered else float("nan")


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def _met(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def _p50_p99(values: list[float]) -> str:
    return f"{_pct(values, 0.5):.2f} / {_pct(values, 0.99):.2f}" if values else "–"


def _clients(c: int) -> str:
    return f"{c} client{'s' if c > 1 else ''}"


def _sweep_row(c: int, cell: Cell, ratio: str) -> list[Any]:
    rps = [r.rps for r in cell.runs]
    return [c, cell.server, f"{statistics.mean(rps):,.0f} ({min(rps):,.0f}–{max(rps):,.0f})",
            f"{cell.mean('p50_ms'):.2f}", f"{cell.mean('p90_ms'):.2f}", f"{cell.mean('p99_ms'):.2f}", cell.errors,
            f"{cell.mean('server_cpu'):.2f}", f"{cell.mean('server_cpu_ms'):.2f}", f"{cell.mean('client_cpu'):.2f}",
            ratio]


def _api_row(c: int, server: str, cell: ApiCell, none: ApiCell | None) -> list[Any]:
    note = ""
    if server != "none" and none is not None and none.pods_per_s and cell.latencies:
        note = f"{cell.pods_per_s / none.pods_per_s:.0%} of the pods/s, +{cell.pct(0.5) - none.pct(0.5):.1f} ms p50"
    return [c, server, len(cell.latencies), f"{cell.pods_per_s:,.1f}", f"{cell.pct(0.5):.1f}", f"{cell.pct(0.99):.1f}",
            f"{cell.cpu_ms_per_pod('kube-apiserver'):.2f}", f"{cell.cpu_ms_per_pod('webhook'):.2f}", cell.errors,
            cell.wrong, note]


def _policies_cost(a: ApiResult) -> list[str]:
    """What the ValidatingAdmissionPolicies add to a pod CREATE, at each concurrency both cells were measured."""
    out = []
    for c in sorted({k[1] for k in a.cells}):
        on, off = a.cells.get((POLICIES, c)), a.cells.get(("gpufrac", c))
        if on and off and on.latencies and off.latencies:
            api_cpu = on.cpu_ms_per_pod("kube-apiserver") - off.cpu_ms_per_pod("kube-apiserver")
            hook_cpu = on.cpu_ms_per_pod("webhook") - off.cpu_ms_per_pod("webhook")
            out += [f"The ValidatingAdmissionPolicies, at {_clients(c)}: a pod CREATE "
                    f"{on.pct(0.5) - off.pct(0.5):+.1f} ms p50 ({on.pct(0.5):.1f} with, {off.pct(0.5):.1f} "
                    f"without), {api_cpu:+.2f} ms of API server CPU and {hook_cpu:+.2f} ms of webhook CPU per pod "
                    "(with them the validating webhook is not called on CREATE: one webhook call instead of "
                    "two).", ""]
    return out


def _webhook_timings(a: ApiResult) -> list[str]:
    """Each webhook call as the API server timed it, per cell."""
    timed = []
    for (server, c), cell in sorted(a.cells.items(), key=lambda kv: (kv[0][1], SERVERS.index(kv[0][0]))):
        if server != "none" and cell.webhook_calls:
            timed.append(f"{_clients(c)}, {server}: " + ", ".join(
                f"{n} {cell.webhook_ms(n):.1f} ms ({int(calls)} calls)"
                for n, (_, calls) in sorted(cell.webhook_calls.items()) if calls))
    if not timed:
        return []
    return ["Each webhook call as the API server times it (`apiserver_admission_webhook_admission_duration_"
            "seconds`, mean; it spans building and encoding the review, the HTTPS round trip, and decoding "
            "the answer and applying its patch): " + "; ".join(timed) + ".", ""]


def _api_p99(a: ApiResult, load: str) -> list[str]:
    """The p99 of a pod CREATE at the highest concurrency, with gpufrac, the do-nothing webhook and none."""
    top = max((c for _, c in a.cells), default=None)
    if top is None or not (a.cells.get(("gpufrac", top)) and a.cells.get(("none", top))):
        return []
    parts = [f"{a.cells[(server, top)].pct(0.99):.1f} ms {label}" for server, label in (
        ("gpufrac", "with gpufrac's webhooks"), ("do-nothing", "with the do-nothing webhook"),
        ("none", "without")) if (server, top) in a.cells]
    return [f"p99 of a pod CREATE at {top} clients: {', '.join(parts)} (load average at the start {load}).", ""]


@dataclass
class Report:
    mode: str
    machine: dict[str, str]
    chart: ChartWebhook
    reviews: list[SeedReview]
    seeds: list[SeedRow] | None = None
    sized: list[SizeRow] | None = None
    profile: tuple[str, str, str] | None = None
    handler: dict[str, Any] | str | None = None
    http: HttpResult | str | None = None
    api: ApiResult | str | None = None
    agent: list[dict[str, Any]] | str | None = None
    nri: dict[str, Any] | str | None = None
    dra: dict[str, Any] | str | None = None
    elapsed: float = 0.0
    targets: list[list[str]] = field(default_factory=list)

    def markdown(self) -> str:
        m = self.machine
        out = [
            f"# gpufrac benchmarks ({self.mode})",
            "",
            f"{m['date']} · {m['cpu']} · {m['python']} · {m['os']} · load average before {m['load']}, "
            f"after {m.get('load_after', '?')} · {self.elapsed:.0f} s in all. Other work on the machine skews "
            "everything here: compare gpufrac with the do-nothing baseline measured in the same run, not "
            "with numbers from another run.",
            "",
            "Seed reviews: " + "; ".join(f"{r.name} ({len(r.raw):,} B)" for r in self.reviews) + ".",
            "",
        ]
        self.targets = []
        out += self._http()
        out += self._api()
        out += self._inprocess()
        out += self._agent()
        out += self._nri()
        out += self._dra()
        out += self._targets()
        out += self._appendix()
        return "\n".join(out).rstrip() + "\n"

    # ---- sections ----

    def _http(self) -> list[str]:
        out = ["## 1. Admission over HTTPS, direct", ""]
        h = self.http
        if h is None or isinstance(h, str):
            return [*out, h or "skipped (--skip http)", ""]
        out += [f"wrk ({', '.join(f'-c {c} -t {t}' for c, t in h.wrk_threads.items())}), keep-alive, posting the "
                f"seed reviews in turn; {h.rounds} × {h.duration:g} s per server and concurrency, alternating "
                f"gpufrac and do-nothing. Both servers: {h.settings} (the chart's workers/threads). {h.pinned}. "
                "errors = socket errors + non-200 + replies without `\"allowed\":true`. CPU columns: cores busy "
                "(1.0 = one core), server = all its processes; a wrk CPU well below 1.0 while the do-nothing "
                "server is saturated means wrk is not the bottleneck.", ""]
        out += self._per_review(h)
        out += self._memory(h)
        out += self._sweep(h)
        out += self._handler_times(h)
        self._http_targets(h)
        return out

    def _sweep(self, h: HttpResult) -> list[str]:
        """All the seed reviews in turn, gpufrac beside do-nothing at each concurrency."""
        rows = []
        for c in sorted({k[1] for k in h.cells}):
            a, b = h.cells.get(("gpufrac", c)), h.cells.get(("do-nothing", c))
            ratio = f"{a.mean('rps') / b.mean('rps'):.0%}" if a is not None and b is not None else ""
            rows += [_sweep_row(c, cell, ratio if cell is a else "") for cell in (a, b) if cell is not None]
        out = ["### All seed reviews in turn, by concurrency", ""]
        out += _table(["concurrency", "server", "req/s mean (min–max)", "p50 ms", "p90 ms", "p99 ms", "errors",
                       "server CPU", "server CPU ms / req", "wrk CPU", "gpufrac / do-nothing"], rows)
        a_cells = [c for (name, _), c in h.cells.items() if name == "gpufrac"]
        b_cells = [c for (name, _), c in h.cells.items() if name == "do-nothing"]
        if a_cells and b_cells:
            extra = statistics.mean(c.mean("server_cpu_ms") for c in a_cells) - statistics.mean(
                c.mean("server_cpu_ms") for c in b_cells)
            decision = (f"; the decision path alone takes {statistics.mean(s.p50_us for s in self.seeds) / 1000:.2f} "
                        "ms per review in process (section 3, mean of the seeds' p50), the rest is logging, metrics "
                        "and Flask work the do-nothing app skips") if self.seeds else ""
            out += ["", f"gpufrac spends {extra:.2f} ms more server CPU per request than the do-nothing webhook "
                    f"(mean over the concurrencies){decision}. With a fixed CPU, req/s ∝ 1 / CPU per request."]
        return out

    def _handler_times(self, h: HttpResult) -> list[str]:
        """gpufrac's own log of the time in its handler, per review and concurrency."""
        concurrencies = sorted({c for c, _ in h.handler_ms})
        rows: list[list[Any]] = [[r.name, *(_p50_p99(h.handler_ms.get((c, r.name), [])) for c in concurrencies)]
                                 for r in self.reviews]
        out = ["", "In-handler time per review inside gpufrac (the `ms` of its one-line-per-review log: JSON parse "
               "to response built, excluding TLS and HTTP) during the runs above:", ""]
        out += _table(["review", *[f"c={c} p50 / p99 ms" for c in concurrencies]], rows)
        out.append("")
        return out

    def _http_targets(self, h: HttpResult) -> None:
        cell = h.cells.get(("gpufrac", TARGET_CONCURRENCY))
        base = h.cells.get(("do-nothing", TARGET_CONCURRENCY))
        if cell and base:
            p99 = max(r.p99_ms for r in cell.runs)
            ratio = cell.mean("rps") / base.mean("rps")
            self.targets.append([f"end-to-end p99 < {TARGET_E2E_P99_MS:g} ms at c={TARGET_CONCURRENCY}",
                                 f"{p99:.1f} ms (worst run; do-nothing {max(r.p99_ms for r in base.runs):.1f} ms)",
                                 _met(p99 < TARGET_E2E_P99_MS)])
            self.targets.append([f"gpufrac ≥ {TARGET_RATIO:.0%} of do-nothing req/s at c={TARGET_CONCURRENCY}, "
                                 "zero errors", f"{ratio:.0%}, {cell.errors + base.errors} errors",
                                 _met(ratio >= TARGET_RATIO and cell.errors + base.errors == 0)])
        worst = [(c, name, _pct(v, 0.99)) for (c, name), v in h.handler_ms.items()]
        for c in (1, TARGET_CONCURRENCY):
            at = [w for w in worst if w[0] == c]
            if at:
                _, name, p99 = max(at, key=lambda w: w[2])
                self.targets.append([f"in-handler p99 < {TARGET_HANDLER_P99_MS:g} ms (seed reviews, server log, "
                                     f"c={c})", f"{p99:.2f} ms (worst: {name})", _met(p99 < TARGET_HANDLER_P99_MS)])

    def _per_review(self, h: HttpResult) -> list[str]:
        if not h.per_review:
            return []
        load = self.machine.get("load", "?")
        out = ["### Per review and per pod CREATE", "",
               f"One review at a time (wrk posting only that body), {h.rounds} round(s) alternating gpufrac and "
               "do-nothing. server CPU ms / req = utime + stime of every server process (master and workers, "
               "from /proc/<pid>/stat) over the run ÷ requests answered. PSS = the server's processes together "
               f"(/proc/<pid>/smaps_rollup), highest sample in the run. Load average at the start: {load}.", ""]
        rows = []
        concurrencies = sorted({c for _, c, _ in h.per_review})
        for r in self.reviews:
            for c in concurrencies:
                a, b = h.per_review.get((r.name, c, "gpufrac")), h.per_review.get((r.name, c, "do-nothing"))
                for cell in (a, b):
                    if cell is None:
                        continue
                    above = ""
                    if cell is a and b is not None:
                        above = f"{a.mean('server_cpu_ms') - b.mean('server_cpu_ms'):+.3f}"
                    rows.append([r.name, c, cell.server, f"{cell.mean('server_cpu_ms'):.3f}", above,
                                 f"{cell.mean('rps'):,.0f}", f"{cell.mean('p50_ms'):.2f}", f"{cell.mean('p99_ms'):.2f}",
                                 cell.errors, f"{max(x.pss_mib for x in cell.runs):.0f}"])
        out += _table(["review", "concurrency", "server", "server CPU ms / req", "gpufrac − do-nothing ms",
                       "req/s", "p50 ms", "p99 ms", "errors", "PSS MiB"], rows)
        out.append("")
        create = [name for name in POD_CREATE if any(k[0] == name for k in h.per_review)]
        if len(create) == len(POD_CREATE):
            out += self._pod_create(h, concurrencies, load)
        return out

    def _pod_create(self, h: HttpResult, concurrencies: list[int], load: str) -> list[str]:
        """What a pod CREATE (the inference pod's two reviews) costs each server, at each concurrency both ran."""
        rows = []
        for c in concurrencies:
            cost = {server: sum(h.per_review[(name, c, server)].mean("server_cpu_ms") for name in POD_CREATE)
                    for server in ("gpufrac", "do-nothing") if all((n, c, server) in h.per_review
                                                                    for n in POD_CREATE)}
            if len(cost) == 2:
                per_review = (cost["gpufrac"] - cost["do-nothing"]) / len(POD_CREATE)
                rows.append([c, f"{cost['gpufrac']:.3f}", f"{cost['do-nothing']:.3f}", f"{per_review:.3f}"])
                self.targets.append([f"pod CREATE (mutate + validate of the inference pod) ≤ "
                                     f"{TARGET_POD_CREATE_CPU_MS:g} ms server CPU, c={c}",
                                     f"{cost['gpufrac']:.2f} ms (do-nothing {cost['do-nothing']:.2f} ms; load "
                                     f"{load})", _met(cost["gpufrac"] <= TARGET_POD_CREATE_CPU_MS)])
                self.targets.append([f"gpufrac above the do-nothing webhook ≤ {TARGET_ABOVE_NOTHING_MS:g} ms per "
                                     f"review (pod CREATE's two), c={c}", f"{per_review:.3f} ms (load {load})",
                                     _met(per_review <= TARGET_ABOVE_NOTHING_MS)])
        out = ["A pod CREATE = the inference pod's /mutate + the /validate of what it became:", ""]
        out += _table(["concurrency", "gpufrac CPU ms / pod", "do-nothing CPU ms / pod",
                       "gpufrac − do-nothing ms per review"], rows)
        out.append("")
        return out

    def _memory(self, h: HttpResult) -> list[str]:
        if not h.idle_pss_mib:
            return []
        load = self.machine.get("load", "?")
        out = ["### Memory", "",
               "PSS of each server's processes together (master and workers; a replica's memory, shared pages "
               "counted once): idle after warming, the highest sample under the seed load above, and with "
               f"maximum-size reviews posted by as many clients as the server has threads ({self.chart.workers} "
               f"workers × {self.chart.threads}). The chart's memory limit: {h.memory_limit}. Reviews over 1 MiB "
               "take turns in the whole server; one that waits past 2 s is answered 503 (counted apart from "
               f"errors). Load average at the start: {load}.", ""]
        rows = []
        for server in ("gpufrac", "do-nothing"):
            seeds = [x.pss_mib for (_, _, name), c in h.per_review.items() if name == server for x in c.runs]
            seeds += [x.pss_mib for (name, _), c in h.cells.items() if name == server for x in c.runs]
            row = [server, f"{h.idle_pss_mib.get(server, float('nan')):.0f}",
                   f"{max(seeds):.0f}" if seeds else "–"]
            for (_review, name), cell in h.maximum.items():
                if name == server:
                    run = cell.runs[-1]
                    row.append(f"{run.pss_mib:.0f} ({cell.requests} answered, {cell.busy} of them 503, "
                               f"{cell.errors} errors)")
            rows.append(row)
            if server == "gpufrac" and seeds:
                self.targets.append([f"PSS ≤ {TARGET_PSS_MIB:g} MiB per replica under the seed load",
                                     f"{max(seeds):.0f} MiB (idle {h.idle_pss_mib.get(server, float('nan')):.0f})",
                                     _met(max(seeds) <= TARGET_PSS_MIB)])
                for (review, name), cell in h.maximum.items():
                    if name == server:
                        peak = max(x.pss_mib for x in cell.runs)
                        self.targets.append([f"PSS ≤ {TARGET_PSS_MIB:g} MiB per replica, {review}",
                                             f"{peak:.0f} MiB, {cell.errors} errors, {cell.busy} of {cell.requests} "
                                             f"answered 503 (chart limit {h.memory_limit}; load {load})",
                                             _met(peak <= TARGET_PSS_MIB and cell.errors == 0)])
        out += _table(["server", "idle PSS MiB", "PSS MiB under the seed load",
                       *[f"PSS MiB, {review}" for (review, name) in h.maximum if name == "gpufrac"]], rows)
        out.append("")
        return out

    def _api(self) -> list[str]:
        out = ["## 2. Admission through kube-apiserver", ""]
        a = self.api
        if a is None or isinstance(a, str):
            return [*out, a or "skipped (--skip apiserver)", ""]
        out += [f"{a.server_version or 'kube-apiserver'} + etcd on this machine (e2e.cluster.ControlPlane, ready "
                f"in {a.cold_start_s:g} s), webhook `gpufrac webhook` (its defaults) registered through the chart's "
                f"configurations ({', '.join(n for _, n in a.webhook_names)}) by URL. Pod CREATEs as admin in "
                f"team-a from N threads of the `kubernetes` Python client (raw responses, no model decoding), "
                "alternating the inference (sm-sharing, 4 GPUs) and notebook (portion) seed pods; "
                f"{a.rounds} × {a.duration:g} s per cell, in turn: the configurations served by gpufrac; served on the "
                "same port with the same certificates by stand-ins: gpufrac's answers replayed (bench.replay_app: "
                "the answer gpufrac gave the first pod of each shape, uid swapped in; the same patches, no work per "
                "review), the do-nothing webhook (bench.noop_app; both on the same gunicorn settings as gpufrac) and "
                "a do-nothing webhook in Go (bench/go_noop, net/http, HTTP/1.1); and deleted ('none'). "
                "wrong = a pod mutated when it should not be or the reverse. The client, the API server, etcd and "
                "the webhook share the machine's cores.", ""]
        rows = [_api_row(c, server, cell, a.cells.get(("none", c)))
                for c in sorted({k[1] for k in a.cells}) for server in SERVERS
                if (cell := a.cells.get((server, c))) is not None]
        out += _table(["client threads", "webhooks served by", "pods", "pods/s", "p50 ms", "p99 ms",
                       "API server CPU ms / pod", "webhook CPU ms / pod", "errors", "wrong", "against none"], rows)
        out.append("")
        out += _policies_cost(a)
        out += _webhook_timings(a)
        notes = [f"Not measured: {server}, {why}." for server, why in a.skipped.items()]
        notes += [f"First error, {server} at {_clients(c)}: {cell.first_error}"
                  for (server, c), cell in a.cells.items() if cell.errors]
        out += [line for note in notes for line in (note, "")]
        load = self.machine.get("load", "?")
        self._api_target(a, load)
        out += _api_p99(a, load)
        return out

    def _api_target(self, a: ApiResult, load: str) -> None:
        gpufrac, none = a.cells.get(("gpufrac", 1)), a.cells.get(("none", 1))
        if not (gpufrac and none and gpufrac.latencies and none.latencies):
            return
        added = gpufrac.pct(0.5) - none.pct(0.5)
        floor = "".join(
            f"; {server} +{cell.pct(0.5) - none.pct(0.5):.1f} ms"
            for server in SERVERS if server not in ("gpufrac", "none", POLICIES)
            if (cell := a.cells.get((server, 1))) is not None and cell.latencies)
        self.targets.append([f"through kube-apiserver: p50 added to a pod CREATE at 1 client ≤ "
                             f"{TARGET_ADDED_P50_MS:g} ms", f"+{added:.1f} ms ({gpufrac.pct(0.5):.1f} vs "
                             f"{none.pct(0.5):.1f} ms{floor}; load {load})",
                             _met(added <= TARGET_ADDED_P50_MS)])

    def _inprocess(self) -> list[str]:
        out = ["## 3. In-process decision path", ""]
        if self.seeds is None or self.sized is None:
            return [*out, "skipped (--skip inprocess)", ""]
        out += ["Seed reviews through what the handler runs (json.loads, parse_review, admission.mutate or "
                ".validate, build_response; no HTTP, logging or metrics), one call at a time:", ""]
        out += _table(["review", "bytes", "best µs", "p50 µs", "p99 µs"],
                      [[s.name, f"{s.body_bytes:,}", f"{s.best_us:,.0f}", f"{s.p50_us:,.0f}", f"{s.p99_us:,.0f}"]
                       for s in self.seeds])
        worst = max(self.seeds, key=lambda s: s.p99_us)
        self.targets.append([f"in-handler p99 < {TARGET_HANDLER_P99_MS:g} ms (seed reviews, in process)",
                             f"{worst.p99_us / 1000:.2f} ms (worst: {worst.name})",
                             _met(worst.p99_us / 1000 < TARGET_HANDLER_P99_MS)])
        out += ["", "Cost by pod size: parse review, admission.mutate, apply the patch, admission.validate (timeit, "
                "best of N, µs per review). 1 annotation = `gpu-fraction: 0.5`; 64 = a memory request and limit per "
                "container while they fit, the rest unrelated annotations.", ""]
        out += _table(["containers", "annotations", "fractional containers", "review bytes", "patch ops",
                       "µs / review"],
                      [[s.containers, s.annotations, s.fractional, f"{s.body_bytes:,}", s.patch_ops,
                        f"{s.us_per_review:,.0f}"] for s in self.sized])
        out.append("")
        return out

    def _agent(self) -> list[str]:
        out = ["## 4. Node agent", ""]
        a = self.agent
        if a is None or isinstance(a, str):
            return [*out, a or "skipped (--skip agent)", ""]
        out += ["The real `Agent` in its own process per row: pynvml over the fake libnvidia-ml.so.1 (which "
                "re-reads and parses its JSON state file on every NVML call, so the NVML share is larger than a "
                "driver's), the fake MPS control daemons (not in the RSS), a fake /proc, pods from an in-memory "
                "API with a watch. 8 GPUs, 400 GPU processes (50 per GPU): 2 per fractional pod, the rest in "
                "non-fractional containers. Reconcile = one `Agent.tick()` (NVML inventory and processes, "
                "daemon checks, node labels/condition, /proc audit of every process, usage metrics); 'after a "
                "change' = the tick right after a MODIFIED watch event reached the cache. Times are medians "
                "(max in brackets); scrape = one HTTP GET /metrics; CPU = process CPU per tick and at the default "
                "10 s interval.", ""]
        out += _table(["fractional pods", "usage series", "violations", "reconcile ms",
                       "after a pod change ms", "of which NVML ms", "scrape ms", "scrape KiB", "RSS MiB",
                       "CPU ms / tick", "CPU % at 10 s"],
                      [[r["pods"], r["attributed_series"], r["violations"],
                        f"{r['tick_ms']:.1f} ({r['tick_max_ms']:.1f})",
                        f"{r['changed_ms']:.1f} ({r['changed_max_ms']:.1f})", f"{r['nvml_ms']:.1f}",
                        f"{r['scrape_ms']:.1f}", f"{r['scrape_bytes'] / 1024:.0f}", f"{r['rss_mib']:.0f}",
                        f"{r['cpu_ms_per_tick']:.1f}", f"{r['cpu_pct_at_interval']:.2f}"] for r in a])
        out.append("")
        return out

    def _nri(self) -> list[str]:
        out = ["## 5. Container creation with the NRI plugin", ""]
        n = self.nri
        if n is None or isinstance(n, str) or "skipped" in n:
            reason = n.get("skipped") if isinstance(n, dict) else n
            return [*out, reason or "skipped (--skip nri)", ""]
        out += [f"The real node's containerd 2 run alone (NRI and CDI on, runc, fake GPUs named by NVIDIA-shaped CDI "
                f"specs; no kubelet), CreateContainer through the CRI timed at the client, "
                f"{n['rounds']} rounds of {n['per_round']} creations without a plugin, then with the agent's NRI "
                "plugin registered (its own process: NriPlugin, the wire session, decide); half the containers a "
                "bound fraction (the plugin hands it a CDI device, containerd resolves it), half no fraction with "
                "NVIDIA_VISIBLE_DEVICES=all (voided). Load average at the end "
                f"{', '.join(f'{x:.2f}' for x in n['load'])}.", ""]
        phases = (("without", "without a plugin"), ("with", "with gpufrac's plugin"))
        kinds = {"fraction": "the bound fraction", "plain": "the container that is no fraction"}
        rows = [(label, n[phase]) for phase, label in phases]
        rows += [(f"{label}: {kinds.get(kind, kind)}", r) for phase, label in phases
                 for kind, r in n.get("by_kind", {}).get(phase, {}).items()]
        out += _table(["", "creations", "p50 ms", "p95 ms", "mean ms"],
                      [[label, r["n"], f"{r['p50_ms']:.1f}", f"{r['p95_ms']:.1f}", f"{r['mean_ms']:.1f}"]
                       for label, r in rows])
        outcomes = ", ".join(f"{count} {outcome}" for outcome, count in sorted(n.get("outcomes", {}).items()))
        out += ["", f"The plugin adds {n['added_p50_ms']:.1f} ms at the median; its CPU: "
                f"{n['plugin_cpu_ms_per_container']:.2f} ms per container it decided ({n['decided']} decided"
                + (f": {outcomes}" if outcomes else "") + ").", ""]
        return out

    def _dra(self) -> list[str]:
        out = ["## 6. The DRA driver's Prepare and Unprepare", ""]
        d = self.dra
        if d is None or isinstance(d, str):
            return [*out, d or "skipped (--skip dra)", ""]
        out += [f"The agent's DRA driver (DraDriver behind DraPlugin, in its own process) called through its gRPC unix "
                f"socket as the kubelet calls it, one claim per call: {d['rounds']} round(s) preparing "
                f"{d['per_round']} claims (time-slicing and sm-sharing in turn), then unpreparing them, each call "
                "alternating with the same call naming no claim (the gRPC and socket floor). Its CDI specs and state "
                f"file are written for real (on {d['filesystem']}, fsync included); `get_claim` is answered in its "
                "process from the claim objects, so the API server's read is not included. Driver CPU = its "
                f"process's CPU clock across the call. Load average {' '.join(f'{x:.2f}' for x in d['load_before'])}"
                f" before, {' '.join(f'{x:.2f}' for x in d['load'])} after.", ""]
        calls, labels = d["calls"], {"prepare_empty": "Prepare, no claim", "unprepare": "Unprepare, 1 claim",
                                     "unprepare_empty": "Unprepare, no claim"}
        rows = [("Prepare, 1 claim", calls["prepare"])]
        rows += [(f"Prepare, 1 claim: {mode}", r) for mode, r in d["by_mode"].items()]
        rows += [(label, calls[kind]) for kind, label in labels.items()]
        out += _table(["call", "calls", "p50 ms", "p95 ms", "mean ms", "driver CPU ms / call"],
                      [[label, r["n"], f"{r['p50_ms']:.2f}", f"{r['p95_ms']:.2f}", f"{r['mean_ms']:.2f}",
                        f"{r['cpu_ms']:.3f}"] for label, r in rows])
        out += ["", f"Driver CPU per claim (its Prepare and its Unprepare): {d['cpu_ms_per_claim']:.3f} ms, "
                f"{d['cpu_ms_per_claim_above_floor']:.3f} ms above the calls naming no claim; Prepare adds "
                f"{d['added_p50_ms']:.2f} ms at the median. {d['specs_written']} of {d['claims']} claims prepared "
                f"with a CDI spec, {d['specs_removed']} specs removed by Unprepare. The driver's process used "
                f"{d['driver_cpu_ms_run']:.1f} ms of CPU from the first measured call to the last, "
                f"{d['driver_cpu_ms_in_calls']:.1f} ms of it within the calls.", ""]
        return out

    def _targets(self) -> list[str]:
        if not self.targets:
            return []
        return ["## Targets", "", *_table(["target", "measured", ""], self.targets), ""]

    def _appendix(self) -> list[str]:
        if self.profile is None:
            return []
        own, cumulative, callers = self.profile
        return ["## Appendix: profile of the decision path", "",
                "cProfile over the seed reviews in turn through the handler's decision path (json.loads, "
                "parse_review, admission.mutate or .validate, build_response). Times include cProfile's "
                "overhead, which inflates many small calls: read them as shares. Top 10 by own time:", "", own, "",
                callers, "", "Top 10 by cumulative time (below `decide`):", "", cumulative, "", *self._handler()]

    def _handler(self) -> list[str]:
        h = self.handler
        out = ["Where a request's time goes in gpufrac's Flask app (the app `gpufrac webhook` serves, with "
               "prometheus_client in multiprocess mode and the JSON log line written to /dev/null; Flask's test "
               "client instead of gunicorn, so no TLS or socket work; cProfile, the seed reviews in turn):", ""]
        if h is None or isinstance(h, str):
            return [*out, h or "not measured", ""]
        whole = h["parts"][0][1] or 1.0
        out += [f"Unprofiled: {h['us_per_request']:,.0f} µs of CPU per request.", ""]
        out += _table(["part (cumulative, nested in the rows above it)", "µs / request (profiled)",
                       "share of the request"],
                      [[label, f"{us:,.0f}", f"{us / whole:.0%}"] for label, us in h["parts"]])
        out.append("")
        return out
