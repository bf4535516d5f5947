"""`make bench` / `python -m bench`: run the sections, print one Markdown report, write bench/results.md."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import (
    admission_tax,
    apiserver,
    direct,
    dra_prepare,
    handler_profile,
    inprocess,
    machine,
    node_agent,
    nri_create,
    server_change,
)
from bench.chart import ROOT, chart_webhook
from bench.report import Report
from bench.reviews import maximum_size_reviews, seed_reviews
from gpufrac.webhook.serve.app import MAX_BODY_BYTES

SECTIONS = ("http", "server", "apiserver", "tax", "inprocess", "agent", "nri", "dra")

MODES = {
    # concurrencies, seconds per run, rounds (a,b per round) ...
    "full": {"http_c": (1, 8, 32, 64), "http_s": 5.0, "http_rounds": 2, "review_c": (1, 8), "review_s": 4.0,
             "maximum_s": 4.0,
             "api_c": (1, 4, 16), "api_s": 6.0, "api_rounds": 2, "quick_inprocess": False,
             "agent_sizes": (1, 50, 200), "agent_ticks": 20, "handler_rounds": 1000, "nri_rounds": 3,
             "nri_per_round": 40, "server_s": 5.0, "server_rounds": 3, "tax_requests": 300, "tax_rounds": 6,
             "dra_rounds": 5, "dra_claims": 40},
    "quick": {"http_c": (1, 8, 32, 64), "http_s": 2.0, "http_rounds": 2, "review_c": (1, 8), "review_s": 2.0,
              "maximum_s": 2.0,
              "api_c": (1, 4, 16), "api_s": 2.0, "api_rounds": 1, "quick_inprocess": True,
              "agent_sizes": (1, 50, 200), "agent_ticks": 5, "handler_rounds": 200, "nri_rounds": 2,
              "nri_per_round": 20, "server_s": 2.0, "server_rounds": 2, "tax_requests": 100, "tax_rounds": 3,
              "dra_rounds": 3, "dra_claims": 20},
    "smoke": {"http_c": (1, 8), "http_s": 1.0, "http_rounds": 1, "review_c": (1,), "review_s": 1.0,
              "maximum_s": 1.0,
              "api_c": (1, 4), "api_s": 1.0, "api_rounds": 1, "quick_inprocess": True,
              "agent_sizes": (1,), "agent_ticks": 2, "handler_rounds": 20, "nri_rounds": 1, "nri_per_round": 4,
              "server_s": 1.0, "server_rounds": 1, "tax_requests": 8, "tax_rounds": 1, "dra_rounds": 1,
              "dra_claims": 4},
}


def _mode_name(args: argparse.Namespace) -> str:
    return "smoke" if args.smoke else "quick" if args.quick else "full"


def _workdir(given: str | None) -> Path:
    return Path(given) if given else Path(tempfile.mkdtemp(prefix="gpufrac-bench-"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="shorter runs (make bench QUICK=1, about 3 minutes)")
    mode.add_argument("--smoke", action="store_true",
                      help="the shortest run that exercises every section (for tests; numbers mean little)")
    parser.add_argument("--skip", action="append", default=[], choices=SECTIONS, help="leave a section out")
    parser.add_argument("--pin", action="store_true",
                        help="pin wrk to the first CPU and the HTTPS servers to the others (on 2 cores the server "
                             "then gets one core; by default both share all cores, as the chart's 2 workers "
                             "expect 2 cores, and wrk needs little)")
    parser.add_argument("--no-install", action="store_true", help="do not apt-get install wrk when it is missing")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results.md"), help="where to write the Markdown")
    parser.add_argument("--workdir", help="scratch directory (default: a temporary one, removed afterwards)")
    args = parser.parse_args(argv)
    name = _mode_name(args)
    m = MODES[name]
    started = time.monotonic()

    chart = chart_webhook()
    policy = chart.policy()
    reviews = seed_reviews(policy)
    report = Report(name, machine.describe(), chart, reviews)
    workdir = _workdir(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    extra: list[str] = []  # the sections that write their own Markdown, after the report's

    def section(name: str, fn):
        """A section that fails is reported as failed (and the exit status is 1); the others still run."""
        try:
            return fn()
        except Exception as err:
            traceback.print_exc()
            failed.append(name)
            return f"failed: {type(err).__name__}: {str(err)[:500]}"

    try:
        if "inprocess" not in args.skip:
            print("[bench] in-process decision path", file=sys.stderr, flush=True)
            report.seeds = inprocess.seeds(reviews, policy, m["quick_inprocess"])
            report.sized = inprocess.sized(policy, m["quick_inprocess"])
            report.profile = inprocess.profile(reviews, policy, m["quick_inprocess"])
            report.handler = handler_profile.run(m["handler_rounds"])
        if "http" not in args.skip:
            report.http = section("http", lambda: direct.run(
                reviews, chart, concurrencies=m["http_c"], duration=m["http_s"], rounds=m["http_rounds"],
                pin=args.pin, workdir=workdir / "https", install=not args.no_install, per_review_c=m["review_c"],
                per_review_s=m["review_s"], maximum=maximum_size_reviews(MAX_BODY_BYTES, policy),
                maximum_s=m["maximum_s"]))
        if "apiserver" not in args.skip:
            report.api = section("apiserver", lambda: apiserver.run(
                concurrencies=m["api_c"], duration=m["api_s"], rounds=m["api_rounds"], workdir=ROOT / ".e2e" / "bench"))
        extra = _own_sections(args, m, chart, reviews, workdir, section)
        if "agent" not in args.skip:
            report.agent = section("agent", lambda: node_agent.run(m["agent_sizes"], m["agent_ticks"]))
        if "nri" not in args.skip:
            print("[bench] container creation with the NRI plugin and without (containerd 2 alone)", file=sys.stderr,
                  flush=True)
            report.nri = section("nri", lambda: nri_create.run(m["nri_rounds"], m["nri_per_round"], workdir / "nri"))
        if "dra" not in args.skip:
            print("[bench] the DRA driver's Prepare and Unprepare through its gRPC socket", file=sys.stderr, flush=True)
            report.dra = section("dra", lambda: dra_prepare.run(m["dra_rounds"], m["dra_claims"], workdir / "dra"))
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    report.machine["load_after"] = machine.load_average()
    report.elapsed = time.monotonic() - started
    text = report.markdown() + "".join(f"\n\n{md}" for md in extra if md)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    print(f"[bench] wrote {out} in {report.elapsed:.0f} s", file=sys.stderr)
    return _exit_status(failed)


def _own_sections(args: argparse.Namespace, m: dict[str, Any], chart: Any, reviews: Any, workdir: Path,
                  section: Callable[[str, Callable[[], Any]], Any]) -> list[str]:
    """The sections that render their own Markdown: the server before and after issue 33 (the base commit's beside
    this tree's, same load), and admission's cost to the API server per request kind (issue 34)."""
    out = []
    if "server" not in args.skip:
        print("[bench] the server before and after issue 33", file=sys.stderr, flush=True)
        out.append(server_change.markdown(section("server", lambda: server_change.run(
            chart, reviews, seconds=m["server_s"], rounds=m["server_rounds"], workdir=workdir / "server",
            install=not args.no_install))))
    if "tax" not in args.skip:
        print("[bench] admission's cost to the API server per request kind", file=sys.stderr, flush=True)
        out.append(admission_tax.markdown(section("tax", lambda: admission_tax.run(
            requests=m["tax_requests"], rounds=m["tax_rounds"], workdir=ROOT / ".e2e" / "bench-tax"))))
    return out


def _exit_status(failed: list[str]) -> int:
    if failed:
        print(f"[bench] failed sections: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
