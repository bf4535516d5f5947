"""The server change of issue 33, before beside after in one run: `gpufrac webhook` as the base commit has it (its
gunicorn internals: the lingering gthread worker, the 0.5 s idle-connection wait, `logging._srcfile`) and as this
tree has it (gunicorn's public surface only), on the same certificates, settings and gunicorn, against the same
load, alternating before and after in each cell. The base commit's gpufrac/ is taken with `git archive`.

`python -m bench.server_change [--seconds S] [--rounds N]` prints the Markdown section; `make bench` adds it to
its report.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import machine
from bench.chart import ROOT, ChartWebhook, chart_webhook
from bench.direct import Run, Server, _script, _wrk, ensure_wrk
from bench.reviews import INFERENCE_MUTATE, INFERENCE_VALIDATE, SeedReview, seed_reviews
from e2e.toolkit.procs import free_port
from e2e.toolkit.server import start_server
from e2e.toolkit.web import answers_200
from gpufrac.certs.generate import write_dev_certs

BASE = "ab869a1"  # main before issue 33: the server on ten private gunicorn, ssl and logging internals
HEADING = "## The server on gunicorn's public surface (issue 33): before and after, one run"
ORDER = ("before", "after")


@dataclass
class Cell:
    """One server at one concurrency: its runs, and the load average when each began."""

    runs: list[Run] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)

    def median(self, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in self.runs)


@dataclass
class ServerChange:
    base: str
    settings: str
    cells: dict[tuple[int, str], Cell]  # (concurrency, before/after)
    idle: dict[str, list[float]]  # before/after -> seconds per review on a fresh connection, with idle ones open
    idle_connections: int
    seconds: float
    rounds: int
    load_before: str
    load_after: str
    workers: dict[str, str]  # before/after -> the worker class gunicorn says it uses, from the server's log

    def markdown(self) -> str:
        out = [
            HEADING,
            "",
            f"Before = the server of {self.base}, after = this tree's. A pod CREATE's two reviews (inference "
            f"/mutate, then /validate of what it became) posted in turn by wrk "
            f"over HTTPS with keep-alive, {self.rounds} round(s) of {self.seconds:g} s per cell, alternating before "
            f"and after; {self.settings}. Server CPU ms / req = utime + stime of every server process over the run "
            f"÷ requests (median of the rounds); the 1-minute load average is read as each run begins. "
            f"Load average at the start: {self.load_before}; at the end: {self.load_after}.",
            "",
            "| concurrency | server | server CPU ms / req | p50 ms | p99 ms | req/s | errors | load at each run |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for (concurrency, name), cell in sorted(self.cells.items(), key=lambda kv: (kv[0][0], ORDER.index(kv[0][1]))):
            out.append(f"| {concurrency} | {name} | {cell.median('server_cpu_ms'):.3f} | {cell.median('p50_ms'):.2f} "
                       f"| {cell.median('p99_ms'):.2f} | {cell.median('rps'):,.0f} | "
                       f"{sum(r.errors for r in cell.runs)} | {'; '.join(cell.loads)} |")
        out += ["", "gunicorn's worker: " + "; ".join(f"{name} `{self.workers[name]}`" for name in ORDER) + "."]
        out += ["", f"With {self.idle_connections} TCP connections open that send nothing (as many as the server has "
                f"threads in all), seconds per review on a fresh connection (five in turn):", ""]
        for name in ORDER:
            out.append(f"- {name}: {', '.join(f'{t:.3f}' for t in self.idle[name])}")
        return "\n".join(out)


def worker_class(log: Path) -> str:
    """What gunicorn logged as its worker class ("Using worker: ...")."""
    found = re.search(r"Using worker: ([\w.]+)", log.read_text(errors="replace"))
    return found[1] if found else "unknown"


def markdown(result: ServerChange | str) -> str:
    """The section, or its heading and why it did not run."""
    return result.markdown() if isinstance(result, ServerChange) else f"{HEADING}\n\n{result}"


def extract_base(commit: str, into: Path) -> Path:
    """The base commit's gpufrac/ package under `into` (`git archive`), for PYTHONPATH."""
    into.mkdir(parents=True, exist_ok=True)
    archive = into / "base.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(ROOT), "archive", commit, "gpufrac"], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()
    return into


def _start(name: str, pythonpath: Path, chart: ChartWebhook, certs: Path, workdir: Path) -> Server:
    port = free_port()
    run_dir = Path(tempfile.mkdtemp(prefix=f"{name}-run-", dir=workdir))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_RUNTIME_DIR": str(run_dir), "PYTHONPATH": str(pythonpath),
           "PROMETHEUS_MULTIPROC_DIR": str(workdir / f"{name}-prometheus")}
    argv = [sys.executable, "-m", "gpufrac", "webhook", *chart.args(), "--certs", str(certs),
            "--bind", f"127.0.0.1:{port}"]
    # Run from the tree it serves: `python -m` puts the working directory first on sys.path.
    proc = start_server(name, argv, workdir / f"{name}.log", lambda: answers_200(f"https://127.0.0.1:{port}/readyz"),
                        env=env, cwd=pythonpath, die_with_parent_signal=None)
    return Server(proc, port)


def idle_connection_wait(server: Server, certs: Path, idle: int, reviews: list[SeedReview]) -> list[float]:
    """Seconds per review on a fresh connection while `idle` TCP connections sit open without sending a byte."""
    import http.client
    import ssl

    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(idle)]
    try:
        time.sleep(0.2)
        times = []
        for _ in range(5):
            started = time.monotonic()
            conn = http.client.HTTPSConnection("localhost", server.port, context=context, timeout=15)
            try:
                conn.request("POST", reviews[0].path, reviews[0].raw, {"Content-Type": "application/json"})
                conn.getresponse().read()
            except OSError:
                pass  # counted by its time: it took as long as it took to fail
            finally:
                conn.close()
            times.append(time.monotonic() - started)
        return times
    finally:
        for sock in held:
            sock.close()


def run(chart: ChartWebhook, reviews: list[SeedReview], *, concurrencies: tuple[int, ...] = (1, 8),
        seconds: float = 5.0, rounds: int = 3, workdir: Path, base: str = BASE,
        install: bool = True) -> ServerChange | str:
    """The comparison, or the reason it could not run."""
    wrk = ensure_wrk(install)
    if wrk is None:
        return "skipped: wrk is not installed and could not be installed (apt-get install wrk)"
    try:
        base_tree = extract_base(base, workdir / "base")
    except (OSError, subprocess.CalledProcessError, tarfile.TarError) as err:
        return f"skipped: the base commit {base} could not be taken with git archive: {err}"
    certs = workdir / "certs"
    write_dev_certs(certs, ["localhost", "127.0.0.1"])
    pod = [r for r in reviews if r.name in (INFERENCE_MUTATE, INFERENCE_VALIDATE)]
    script = _script(workdir, "pod-create", pod)
    load_before = machine.load_average()
    servers: dict[str, Server] = {}
    try:
        servers["before"] = _start("before", base_tree, chart, certs, workdir)
        servers["after"] = _start("after", ROOT, chart, certs, workdir)

        def post(name: str, concurrency: int, duration: float) -> Run:
            server = servers[name]
            return _wrk(wrk, script, f"https://127.0.0.1:{server.port}", concurrency, min(2, concurrency), duration,
                        None, server)

        for name in ORDER:  # imports, first TLS contexts, lazy paths: before anything is recorded
            post(name, 8, 1)
        cells: dict[tuple[int, str], Cell] = {}
        for concurrency in concurrencies:
            for _ in range(rounds):
                for name in ORDER:
                    cell = cells.setdefault((concurrency, name), Cell())
                    cell.loads.append(machine.load_average().split()[0])
                    cell.runs.append(post(name, concurrency, seconds))
                    print(f"[bench] server change {name:6s} c={concurrency:<3d} "
                          f"{cell.runs[-1].server_cpu_ms:.3f} ms CPU/req p50 {cell.runs[-1].p50_ms:.2f} ms",
                          file=sys.stderr, flush=True)
        idle_count = chart.workers * chart.threads
        idle = {name: idle_connection_wait(servers[name], certs, idle_count, pod) for name in ORDER}
    finally:
        for server in servers.values():
            server.stop()
    workers = {name: worker_class(server.log_path) for name, server in servers.items()}
    return ServerChange(base, f"gunicorn gthread, {chart.workers} workers × {chart.threads} threads (the chart's), "
                        "TLS, the same gunicorn for both", cells, idle, chart.workers * chart.threads, seconds,
                        rounds, load_before, machine.load_average(), workers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.server_change", description=__doc__)
    parser.add_argument("--seconds", type=int, default=5, help="whole seconds per run, as wrk takes them (default 5)")
    parser.add_argument("--rounds", type=int, default=3, help="before/after rounds per concurrency (default 3)")
    parser.add_argument("--base", default=BASE, help=f"the commit whose server is 'before' (default {BASE})")
    args = parser.parse_args(argv)
    chart = chart_webhook()
    with tempfile.TemporaryDirectory(prefix="gpufrac-bench-server-") as tmp:
        result = run(chart, seed_reviews(chart.policy()), seconds=args.seconds, rounds=args.rounds,
                     workdir=Path(tmp), base=args.base)
    print(markdown(result))
    return 1 if isinstance(result, str) else 0


if __name__ == "__main__":
    raise SystemExit(main())
