"""The gpufrac webhook as a host process (`python -m gpufrac webhook` over HTTPS on loopback): its command
line and environment for the API-only cluster, and `WebhookProcess` for the tests that talk to it directly."""

from __future__ import annotations

import http.client
import os
import signal
import ssl
import sys
import tempfile
from pathlib import Path

from e2e.toolkit.procs import Proc, free_port, rss_kib, spawn, tail
from e2e.toolkit.server import wait_ready
from e2e.toolkit.web import answers_200

REPO_ROOT = Path(__file__).resolve().parents[2]


def argv(certs: Path, port: int, *, workers: int | None = None, threads: int | None = None) -> list[str]:
    args = [sys.executable, "-m", "gpufrac", "webhook", "--certs", str(certs), "--bind", f"127.0.0.1:{port}"]
    if workers is not None:
        args += ["--workers", str(workers)]
    if threads is not None:
        args += ["--threads", str(threads)]
    return args


def env(run_dir: Path, metrics_dir: Path | None = None) -> dict[str, str]:
    """The webhook's environment: the repository on PYTHONPATH, and a gunicorn control-socket directory of its
    own (gunicorn >= 23 opens $XDG_RUNTIME_DIR/gunicorn.ctl, else ~/.gunicorn/), so parallel webhooks (tests,
    demo, cluster-up) do not collide."""
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    out = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        "XDG_RUNTIME_DIR": str(run_dir),
    }
    if metrics_dir is not None:
        out["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    return out


def children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for task in tasks:
        try:
            found += [int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:
            continue
    return sorted(found)


class WebhookProcess:
    """`python -m gpufrac webhook` with its CA at certs/ca.crt, ready when /readyz answers and all `workers`
    are forked."""

    def __init__(self, certs: Path, log: Path, *, workers: int = 2, threads: int = 4, timeout: float = 60,
                 metrics_dir: Path | None = None) -> None:
        self.certs, self.log_path, self.workers = certs, log, workers
        self.port = free_port()
        run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=log.parent))
        self.process: Proc = spawn("webhook", argv(certs, self.port, workers=workers, threads=threads), log,
                                   env=env(run_dir, metrics_dir), cwd=REPO_ROOT,
                                   die_with_parent_signal=signal.SIGTERM)
        try:
            wait_ready(self.process, lambda: answers_200(f"https://127.0.0.1:{self.port}/readyz")
                       and len(self.worker_pids()) == workers, timeout)
        except BaseException:
            self.process.stop()
            raise

    @property
    def popen(self):
        assert self.process.popen is not None
        return self.process.popen

    def context(self, ca: Path | None = None) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(ca or self.certs / "ca.crt"))

    def connection(self, ca: Path | None = None, timeout: float = 10) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("localhost", self.port, context=self.context(ca), timeout=timeout)

    def request(self, method: str, path: str, body: bytes | None = None,
                conn: http.client.HTTPSConnection | None = None) -> tuple[int, bytes]:
        own = conn is None
        conn = conn or self.connection()
        try:
            conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            if own:
                conn.close()

    def get(self, path: str) -> tuple[int, bytes]:
        return self.request("GET", path)

    def post(self, path: str, body: bytes, conn: http.client.HTTPSConnection) -> tuple[int, bytes]:
        return self.request("POST", path, body, conn)

    def worker_pids(self) -> list[int]:
        return children(self.process.pid)

    def rss_kib(self) -> int:
        return rss_kib(self.process.pid, *self.worker_pids())

    def tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)

    def stop(self, timeout: float = 30) -> int | None:
        self.process.stop(timeout=timeout)
        return self.process.returncode
