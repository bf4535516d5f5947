"""`make soak`: the webhook process under sustained load for a while, with every fault at once.

    python -m e2e.hardening.soak --seconds 60

One gunicorn webhook over HTTPS; N keep-alive client threads send a mix of reviews (reconnecting now and then)
while the driver rotates the serving certificate every `--rotate-every` seconds, one thread sends random hostile
bodies from the hypothesis strategies, and one stalled client per stage (TCP, half a ClientHello, half the
headers, half the body) is held open. At the end it checks memory, workers and the log, then sends SIGTERM under
load and checks that every review sent before it was answered and the process exits 0.

Prints the figures and exits 1 on any failure. Loopback only; bounded by --seconds (plus about 30 s).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

from e2e.hardening.harness import Load, Server, check_http_answer, slow_client

GRACEFUL_TIMEOUT = 20


def fuzz(server: Server, stop: threading.Event, counts: dict[str, int], failures: list[str]) -> None:
    from hypothesis.errors import NonInteractiveExampleWarning

    from testkit.strategies import raw_bodies

    strategy = raw_bodies()
    paths = ("/mutate", "/validate")
    while not stop.is_set():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NonInteractiveExampleWarning)
            body = strategy.example()
        conn = server.connection(timeout=10)
        try:
            status, data = server.post(paths[counts["sent"] % 2], body, conn)
            check_http_answer(body, status, data)
            counts["sent"] += 1
            counts[f"status_{status}"] = counts.get(f"status_{status}", 0) + 1
        except Exception as exc:  # every kind of failure is a finding: count it and go on
            failures.append(f"{type(exc).__name__}: {exc} for {body[:200]!r}")
        finally:
            conn.close()


def soak(seconds: float, threads: int, workers: int, server_threads: int, rotate_every: float) -> dict:
    base = Path(tempfile.mkdtemp(prefix="gpufrac-soak-"))
    server = Server(base, workers=workers, threads=server_threads)
    report: dict = {"seconds": seconds, "client_threads": threads, "workers": workers, "threads": server_threads}
    problems: list[str] = []
    try:
        initial_workers = server.worker_pids()
        Load(server, threads=threads, total=500, seconds=30).run()  # warm-up
        rss_before = server.rss_kib()
        stalled = [slow_client(server, stage) for stage in ("tcp", "hello", "headers", "body")]
        stop = threading.Event()
        fuzz_counts = {"sent": 0}
        fuzz_failures: list[str] = []
        fuzzer = threading.Thread(target=fuzz, args=(server, stop, fuzz_counts, fuzz_failures), daemon=True)
        fuzzer.start()
        load = Load(server, threads=threads, seconds=seconds, reconnect_every=50).start()
        rotations = 0
        started = time.monotonic()
        while time.monotonic() - started < seconds - 1:
            time.sleep(min(rotate_every, max(0.0, seconds - 1 - (time.monotonic() - started))))
            if time.monotonic() - started < seconds - 1:
                server.rotate()
                rotations += 1
        result = load.join()
        stop.set()
        fuzzer.join(30)
        for sock in stalled:
            sock.close()
        rss_after = server.rss_kib()
        report.update({
            "load": result.summary(), "requests_ok": result.ok, "requests_failed": len(result.failures),
            "requests_per_second": round(result.rate), "p50_ms": round(result.percentile(0.5) * 1000, 1),
            "p99_ms": round(result.percentile(0.99) * 1000, 1), "connections": result.connections,
            "rotations": rotations, "rss_kib_before": rss_before, "rss_kib_after": rss_after,
            "fuzz": fuzz_counts, "fuzz_failures": len(fuzz_failures), "stalled_clients": len(stalled),
        })
        problems += result.failures[:10] + fuzz_failures[:10]
        if rss_after > rss_before * 1.15 + 8 * 1024:
            problems.append(f"RSS grew from {rss_before} KiB to {rss_after} KiB")
        if server.worker_pids() != initial_workers:
            problems.append(f"workers changed: {initial_workers} -> {server.worker_pids()}")

        # SIGTERM under load.
        load = Load(server, threads=threads, seconds=GRACEFUL_TIMEOUT, reconnect_every=10, timeout=GRACEFUL_TIMEOUT,
                    stop_on_refused=True).start()
        time.sleep(2)
        signalled = time.monotonic()
        os.kill(server.popen.pid, signal.SIGTERM)
        code = server.popen.wait(timeout=GRACEFUL_TIMEOUT + 5)
        exited = time.monotonic() - signalled
        load.stop()
        final = load.join()
        lost = [t for t in final.timeline if t[1] < signalled and t[3]]
        report["sigterm"] = {"sent_before": sum(1 for t in final.timeline if t[1] < signalled), "lost": len(lost),
                             "exit_code": code, "exit_seconds": round(exited, 2)}
        if code != 0 or lost:
            problems.append(f"SIGTERM: exit {code}, {len(lost)} reviews sent before it lost")
        problems += server.log_problems()[:10]
    finally:
        server.stop()
    report["problems"] = problems
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--client-threads", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4, help="gunicorn threads per worker (the chart's default)")
    parser.add_argument("--rotate-every", type=float, default=10)
    args = parser.parse_args(argv)
    report = soak(args.seconds, args.client_threads, args.workers, args.threads, args.rotate_every)
    print(json.dumps(report, indent=2))
    print("soak:", "FAILED" if report["problems"] else "ok", file=sys.stderr)
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
