"""Where a worker's CPU goes under load, by part: py-spy (a sampling profiler, a dev tool: `pip install py-spy`; not
a dependency of gpufrac or of `make bench`) on one worker of `gpufrac webhook` and of the do-nothing webhook while
wrk posts a pod CREATE's two reviews (the inference pod's /mutate, then its /validate).

python -m bench.server_profile [--seconds 10] [--concurrency 8]   # prints a Markdown table

Each sample is one active thread's stack, put in the first part (in the order of PARTS) that any of its frames
belongs to: the JSON encoding inside a log call counts as logging, the dict reads inside the decision as the
decision.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.chart import ROOT, chart_webhook
from bench.direct import _script, ensure_wrk, start
from bench.procs import group_pids
from bench.reviews import POD_CREATE, seed_reviews
from e2e.toolkit.procs import free_port
from gpufrac.certs.generate import write_dev_certs

# (part, substrings of a frame's file name); the first part any frame of a sample matches takes the sample.
PARTS = (
    ("per-review log line (logging, JSON formatter, handler)", ("logging/", "gpufrac/core/jsonlog")),
    ("gunicorn access log", ("gunicorn/glogging",)),
    ("metrics (prometheus_client)", ("prometheus_client/",)),
    ("decision (gpufrac.webhook rules, patch, response)",
     ("gpufrac/webhook/decide/", "gpufrac/core/")),
    ("JSON decode/encode of the review", ("json/",)),
    ("TLS and socket I/O", ("ssl.py", "socket.py", "selectors.py", "gunicorn/sock", "gpufrac/webhook/serve/tls")),
    ("gpufrac app glue (app.py)", ("gpufrac/webhook/serve/app",)),
    ("Flask / Werkzeug request and response", ("flask/", "werkzeug/")),
    ("gunicorn HTTP parsing and response writing", ("gunicorn/http/",)),
    ("gunicorn worker loop, thread pool, locks", ("gunicorn/", "concurrent/", "threading.py", "queue.py")),
)
OTHER = "other"


def classify(stack: str) -> str:
    for part, needles in PARTS:
        if any(n in stack for n in needles):
            return part
    return OTHER


def _profile_one(name: str, argv: list[str], env: dict[str, str], workdir: Path, wrk: str, script: Path,
                 seconds: float, concurrency: int) -> collections.Counter[str]:
    port = free_port()
    server = start(name, [*argv, "--bind", f"127.0.0.1:{port}"], workdir / f"{name}.log", env, port)
    try:
        url = f"https://127.0.0.1:{port}"
        subprocess.run([wrk, "-s", str(script), "-c", "8", "-t", "2", "-d", "2s", url], capture_output=True,
                       check=False)
        workers = [p for p in group_pids(server.proc.pid) if p != server.proc.pid]
        load = subprocess.Popen([wrk, "-s", str(script), "-c", str(concurrency), "-t", "2", "-d",
                                 f"{seconds + 2:g}s", url], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)
        spies = [subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--duration", f"{seconds:g}", "--rate",
                                   "100", "--gil", "--format", "raw", "--output", str(workdir / f"{name}-{pid}.raw")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for pid in workers]
        for spy in spies:
            spy.wait()
        load.wait()
    finally:
        server.stop()
    counts: collections.Counter[str] = collections.Counter()
    for raw in workdir.glob(f"{name}-*.raw"):
        for line in raw.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if stack and n.isdigit():
                counts[classify(stack)] += int(n)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.server_profile", description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--keep", help="copy py-spy's raw (collapsed) stacks into this directory")
    args = parser.parse_args(argv)
    wrk = ensure_wrk()
    if wrk is None or shutil.which("py-spy") is None:
        print("needs wrk and py-spy (pip install py-spy)", file=sys.stderr)
        return 2
    chart = chart_webhook()
    reviews = [r for r in seed_reviews(chart.policy()) if r.name in POD_CREATE]
    workdir = Path(tempfile.mkdtemp(prefix="gpufrac-profile-"))
    try:
        write_dev_certs(workdir / "certs", ["localhost", "127.0.0.1"])
        script = _script(workdir, "pod-create", reviews)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_RUNTIME_DIR": str(workdir),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        common = ["--certs", str(workdir / "certs")]
        results = {}
        for name, module in (("gpufrac", ["-m", "gpufrac", "webhook", *chart.args()]),
                             ("do-nothing", ["-m", "bench.noop_app", "--workers", str(chart.workers),
                                             "--threads", str(chart.threads)])):
            results[name] = _profile_one(name, [sys.executable, *module, *common],
                                         {**env, "PROMETHEUS_MULTIPROC_DIR": str(workdir / f"{name}-prometheus")},
                                         workdir, wrk, script, args.seconds, args.concurrency)
        if args.keep:
            Path(args.keep).mkdir(parents=True, exist_ok=True)
            for raw in workdir.glob("*.raw"):
                shutil.copy(raw, Path(args.keep) / raw.name)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"py-spy --gil (the thread holding the GIL: Python code), every worker, {args.seconds:g} s at 100 Hz, "
          f"wrk -c {args.concurrency} posting "
          f"the pod CREATE's two reviews; load average after: {load}. Share of the workers' samples:\n")
    print("| part | gpufrac | do-nothing |")
    print("|---|---|---|")
    parts = [p for p, _ in PARTS] + [OTHER]
    totals = {name: sum(c.values()) or 1 for name, c in results.items()}
    for part in parts:
        cells = [f"{results[name][part] / totals[name]:.0%}" for name in ("gpufrac", "do-nothing")]
        if any(c != "0%" for c in cells):
            print(f"| {part} | {' | '.join(cells)} |")
    print(f"| samples | {totals['gpufrac']} | {totals['do-nothing']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
