"""The whole bench report rendered from data that reaches every section and every branch of it (both servers and
one alone, a cell with errors, a server not measured, the policies' cell, every target), compared with the
rendering kept in tests/bench/data/full_report.md: a change to the report's code that changes a byte of it shows
here. When the report is meant to change, regenerate the file: BENCH_REPORT_REGENERATE=1 pytest this file."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from bench.apiserver import POLICIES, SERVERS, ApiCell, ApiResult
from bench.chart import ChartWebhook
from bench.direct import Cell, HttpResult, Run
from bench.inprocess import SeedRow, SizeRow
from bench.report import TARGET_CONCURRENCY, Report
from bench.reviews import POD_CREATE, SeedReview

GOLDEN = Path(__file__).with_name("data") / "full_report.md"
MACHINE = {"date": "2026-12-03 09:00 UTC", "cpu": "2 × test CPU", "python": "Python 3.11.7", "os": "Linux 6.1",
           "load": "0.50 0.40 0.30", "load_after": "1.10 0.90 0.70"}
REVIEWS = [SeedReview(POD_CREATE[0], "/mutate", {"kind": "AdmissionReview", "n": 1}),
           SeedReview(POD_CREATE[1], "/validate", {"kind": "AdmissionReview", "n": 22}),
           SeedReview("notebook CREATE /mutate", "/mutate", {"kind": "AdmissionReview", "n": 333})]


def run(rps: float, p99: float, *, errors: int = 0, cpu: float = 0.8, pss: float = 60.0, busy: int = 0) -> Run:
    return Run(requests=int(rps * 5), seconds=5.0, p50_ms=p99 / 3, p90_ms=p99 / 2, p99_ms=p99, max_ms=p99 * 2,
               errors=errors, client_cpu=0.4, server_cpu=cpu, pss_mib=pss, busy=busy)


def cell(server: str, concurrency: int, *runs: Run) -> Cell:
    return Cell(server, concurrency, list(runs))


def http() -> HttpResult:
    cells = {("gpufrac", c): cell("gpufrac", c, run(900 + c, 4.0 + c / 8, pss=70 + c), run(950 + c, 4.5 + c / 8))
             for c in (1, 8, TARGET_CONCURRENCY)}
    cells |= {("do-nothing", c): cell("do-nothing", c, run(1200 + c, 3.0 + c / 10, cpu=0.6, pss=40))
              for c in (1, TARGET_CONCURRENCY)}
    per_review = {(name, c, server): cell(server, c, run(700 + i * 10 + c, 5.0, pss=55 + i,
                                                           cpu=0.5 + i / 10 + (server == "gpufrac") / 20))
                  for i, name in enumerate(POD_CREATE) for c in (1, 4) for server in ("gpufrac", "do-nothing")}
    per_review[(REVIEWS[2].name, 1, "gpufrac")] = cell("gpufrac", 1, run(640, 6.0, errors=2))
    maximum = {("maximum-size pod", "gpufrac"): cell("gpufrac", 8, run(3, 900.0, pss=88, busy=1), run(2, 950.0)),
               ("maximum-size pod", "do-nothing"): cell("do-nothing", 8, run(9, 300.0, pss=45))}
    handler_ms = {(c, r.name): [0.2 + i / 10 + c / 100 + k / 50 for k in range(20)]
                  for c in (1, TARGET_CONCURRENCY) for i, r in enumerate(REVIEWS)}
    return HttpResult(cells=cells, per_review=per_review, idle_pss_mib={"gpufrac": 51.0, "do-nothing": 30.0},
                      maximum=maximum, memory_limit="256Mi", handler_ms=handler_ms,
                      pinned="servers pinned to CPU 1, wrk to CPU 0", wrk_threads={1: 1, 8: 2, 32: 2}, duration=5.0,
                      rounds=2, settings="2 workers × 4 threads")


def api_cell(server: str, concurrency: int, p50_ms: float, *, errors: int = 0, wrong: int = 0) -> ApiCell:
    pods = 40 * concurrency
    c = ApiCell(server, concurrency, latencies=[p50_ms / 1000 * (1 + k / pods) for k in range(pods)],
                seconds=pods * p50_ms / 1000 / concurrency, errors=errors, wrong=wrong,
                first_error="admission webhook refused" if errors else "")
    c.cpu_seconds = {"kube-apiserver": pods * 0.004, **({"webhook": pods * 0.002} if server != "none" else {})}
    if server != "none":
        c.webhook_calls = {"mutate.gpufrac.io": [pods * 0.002, pods],
                           "validate.gpufrac.io": [pods * 0.001, pods if server != POLICIES else 0]}
    return c


def api() -> ApiResult:
    p50 = dict(zip(SERVERS, (11.0, 10.0, 8.5, 8.0, 7.5, 4.0), strict=True))
    cells = {(s, c): api_cell(s, c, ms * (1 + c / 10), errors=3 if (s, c) == ("gpufrac", 4) else 0,
                              wrong=1 if (s, c) == ("do-nothing", 4) else 0)
             for s, ms in p50.items() if s != "do-nothing (Go)" for c in (1, 4)}
    return ApiResult(cells, "v1.36.3", 5.0, {"do-nothing (Go)": "no Go toolchain on PATH"}, 2, 6.11,
                     [("MutatingWebhookConfiguration", "gpufrac"), ("ValidatingWebhookConfiguration", "gpufrac")])


def agent_row(pods: int) -> dict[str, float]:
    return {"pods": pods, "attributed_series": pods * 4, "violations": pods // 10, "tick_ms": 12.5 + pods / 10,
            "tick_max_ms": 20.0 + pods / 10, "changed_ms": 13.0, "changed_max_ms": 22.5, "nvml_ms": 6.25,
            "scrape_ms": 1.5, "scrape_bytes": 2048 * pods, "rss_mib": 48.0, "cpu_ms_per_tick": 9.75,
            "cpu_pct_at_interval": 0.0975}


def nri() -> dict[str, object]:
    phase = {"n": 80, "p50_ms": 30.0, "p95_ms": 41.0, "mean_ms": 31.5}
    return {"without": phase, "with": {**phase, "p50_ms": 31.2}, "added_p50_ms": 1.2,
            "plugin_cpu_ms_per_container": 0.61, "decided": 82, "rounds": 2, "per_round": 40,
            "load": (1.5, 1.2, 1.0), "outcomes": {"injected": 42, "voided": 40},
            "by_kind": {"with": {"fraction": {**phase, "p50_ms": 33.0}, "plain": phase, "other": phase}}}


def dra() -> dict[str, object]:
    def calls(n: int, p50: float, cpu: float) -> dict[str, float]:
        return {"n": n, "p50_ms": p50, "p95_ms": p50 * 3, "mean_ms": p50 * 1.4, "cpu_ms": cpu}

    return {"calls": {"prepare": calls(8, 3.5, 1.7), "prepare_empty": calls(8, 0.45, 0.29),
                      "unprepare": calls(8, 2.5, 1.3), "unprepare_empty": calls(8, 0.42, 0.27)},
            "by_mode": {"time-slicing": calls(4, 3.4, 1.72), "sm-sharing": calls(4, 3.6, 1.68)},
            "claims": 8, "specs_written": 8, "specs_removed": 8, "prepared_left": 0, "cpu_ms_per_claim": 3.0,
            "cpu_ms_per_claim_above_floor": 2.44, "driver_cpu_ms_run": 36.0, "driver_cpu_ms_in_calls": 35.5,
            "added_p50_ms": 3.05, "rounds": 2, "per_round": 4, "filesystem": "ext4",
            "load_before": (0.5, 0.4, 0.3), "load": (1.1, 0.9, 0.7)}


def full_report() -> Report:
    chart = ChartWebhook(workers=2, threads=4, scheduler_users=("sched",), scheduler_groups=(),
                         require_enforcing_node=False, mps_root="/run/nvidia/mps", memory_limit="256Mi")
    report = Report("full", MACHINE, chart, REVIEWS, elapsed=123.4)
    report.seeds = [SeedRow(r.name, len(r.raw) * 100, 80.0 + i, 95.0 + i, 400.0 + 900 * i)
                    for i, r in enumerate(REVIEWS)]
    report.sized = [SizeRow(c, a, min(c, a), 1000 * c + a, c + a, 120.0 * c) for c in (1, 50) for a in (1, 64)]
    report.profile = ("own-time table", "cumulative table", "callers table")
    report.handler = {"us_per_request": 640.0, "parts": [("request", 1000.0), ("decide", 400.0), ("log", 0.0)]}
    report.http, report.api, report.nri, report.dra = http(), api(), nri(), dra()
    report.agent = [agent_row(10), agent_row(100)]
    return report


def test_the_full_report_is_the_kept_rendering_byte_for_byte() -> None:
    text = full_report().markdown()
    if os.environ.get("BENCH_REPORT_REGENERATE"):
        GOLDEN.write_text(text)
    kept = GOLDEN.read_text()
    diff = "".join(difflib.unified_diff(kept.splitlines(True), text.splitlines(True), "kept", "now"))
    assert text == kept, diff[:4000]


def test_the_kept_rendering_reaches_every_section_and_target() -> None:
    kept = GOLDEN.read_text()
    for heading in ("## 1. Admission over HTTPS, direct", "### Per review and per pod CREATE", "### Memory",
                    "### All seed reviews in turn, by concurrency", "## 2. Admission through kube-apiserver",
                    "## 3. In-process decision path", "## 4. Node agent",
                    "## 5. Container creation with the NRI plugin", "## 6. The DRA driver's Prepare and Unprepare",
                    "## Targets",
                    "## Appendix: profile of the decision path"):
        assert heading in kept, heading
    targets = kept.partition("## Targets")[2].partition("## Appendix")[0]
    assert targets.count("**met**") + targets.count("**missed**") == 12
    assert "Not measured: do-nothing (Go), no Go toolchain on PATH." in kept
    assert "First error, gpufrac at 4 clients: admission webhook refused" in kept


def test_sections_not_run_say_why() -> None:
    report = Report("smoke", MACHINE, full_report().chart, REVIEWS)
    report.api = "skipped: no kube-apiserver"
    text = report.markdown()
    for line in ("skipped (--skip http)", "skipped: no kube-apiserver", "skipped (--skip inprocess)",
                 "skipped (--skip agent)", "skipped (--skip nri)", "skipped (--skip dra)"):
        assert f"\n{line}\n" in text, line
    assert "## Targets" not in text and "## Appendix" not in text
