"""The webhook as a real gunicorn process over HTTPS, and the tools that push on it: a bounded load generator
with keep-alive connections, certificate rotation, slow clients, worker and memory accounting from /proc.

Loopback only; every loop is bounded by a count and a deadline.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.toolkit.webhook import WebhookProcess
from gpufrac.certs.generate import KeyPair, issue_ca, issue_serving_cert, write_serving_files

ROOT = Path(__file__).resolve().parents[2]
BAD_LOG = re.compile(r"Traceback|Worker \(pid:\d+\) was sent|WORKER TIMEOUT|unexpected error|Exception in worker")


def check_http_answer(body: bytes, status: int, data: bytes) -> dict[str, Any]:
    """Status 200 with a well-formed AdmissionReview echoing the uid, or a 4xx with a JSON error; never a 5xx."""
    assert status < 500, f"HTTP {status} for {body[:300]!r}: {data[:500]!r}"
    answer = json.loads(data)
    if status != 200:
        assert 400 <= status < 500 and isinstance(answer.get("error"), str) and answer.get("code") == status, answer
        return answer
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview", answer
    response = answer["response"]
    sent = json.loads(body)
    assert response["uid"] == sent["request"]["uid"]
    assert isinstance(response["allowed"], bool)
    if not response["allowed"]:
        assert response["status"]["code"] == 403 and response["status"]["message"]
    if "patch" in response:
        assert response["patchType"] == "JSONPatch" and isinstance(json.loads(base64.b64decode(response["patch"])),
                                                                  list)
    return answer


class Server(WebhookProcess):
    """The webhook with a CA of its own (so the tests can rotate its serving certificate) under `base`."""

    def __init__(self, base: Path, *, workers: int = 2, threads: int = 4) -> None:
        self.base = base
        self.ca = issue_ca("hardening-ca")
        write_serving_files(base / "certs", self.ca, issue_serving_cert(self.ca))
        super().__init__(base / "certs", base / "webhook.log", workers=workers, threads=threads)

    def rotate(self) -> KeyPair:
        """A new serving certificate from the same CA, written as a Secret update would (rename into place)."""
        serving = issue_serving_cert(self.ca)
        write_serving_files(self.certs, self.ca, serving)
        return serving

    def log_problems(self) -> list[str]:
        return [line for line in self.log_path.read_text(errors="replace").splitlines() if BAD_LOG.search(line)]


@dataclass
class LoadResult:
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    connections: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    # (send started, send finished, finished, error or "") per request, for the SIGTERM analysis
    timeline: list[tuple[float, float, float, str]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def percentile(self, p: float) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * p))]

    def summary(self) -> str:
        kinds = Counter(f.split(":")[0] for f in self.failures)
        return (f"{self.ok} ok, {len(self.failures)} failed {dict(kinds)} in {self.seconds:.1f}s = {self.rate:.0f}/s "
                f"over {self.connections} connections, p50 {self.percentile(0.5) * 1000:.1f} ms, "
                f"p99 {self.percentile(0.99) * 1000:.1f} ms")


def sample_bodies() -> list[tuple[str, bytes]]:
    """A fixed mix of reviews: mutations that patch, denials, non-fractional pods, updates."""
    from testkit.pods import INFERENCE, NOTEBOOK, pod
    from testkit.strategies import BINDER, envelope

    portion = pod(NOTEBOOK)
    bodies = [
        ("/mutate", envelope(pod(INFERENCE))),
        ("/validate", envelope(pod(INFERENCE))),
        ("/mutate", envelope(pod(NOTEBOOK))),
        ("/validate", envelope(pod({"gpu-fraction": "1.5"}))),
        ("/mutate", envelope(pod({"gpu-memory": "20480", "gpu-memory.limit": "40Gi"}, "app", "sidecar"))),
        ("/validate", envelope(pod({}))),
        ("/validate", envelope(portion, operation="UPDATE", old=portion, user=BINDER)),
    ]
    return [(path, json.dumps(body).encode()) for path, body in bodies]


class Load:
    """N client threads with keep-alive connections, each reconnecting every `reconnect_every` requests, until
    `total` requests are done, `seconds` have passed, or stop() is called. Everything that is not a 200 with a
    well-formed review is a failure, with its reason."""

    def __init__(self, server: Server, *, threads: int = 8, total: int = 10**9, seconds: float = 10,
                 reconnect_every: int = 50, timeout: float = 10, stop_on_refused: bool = False) -> None:
        self.server, self.threads, self.total, self.seconds = server, threads, total, seconds
        self.reconnect_every, self.timeout, self.stop_on_refused = reconnect_every, timeout, stop_on_refused
        self.result = LoadResult()
        self._lock = threading.Lock()
        self._issued = 0
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []
        self._bodies = sample_bodies()

    def _next(self) -> int | None:
        with self._lock:
            if self._issued >= self.total or self._stop.is_set():
                return None
            self._issued += 1
            return self._issued

    def _run(self, deadline: float) -> None:
        conn: http.client.HTTPSConnection | None = None
        done = 0
        while time.monotonic() < deadline:
            n = self._next()
            if n is None:
                break
            path, body = self._bodies[n % len(self._bodies)]
            if conn is None or done % self.reconnect_every == 0:
                if conn is not None:
                    conn.close()
                conn = self.server.connection(timeout=self.timeout)
                with self._lock:
                    self.result.connections += 1
            done += 1
            started = time.monotonic()
            sent = float("inf")
            error = ""
            try:
                conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                sent = time.monotonic()
                response = conn.getresponse()
                data = response.read()
                check_http_answer(body, response.status, data)
                if response.status != 200:
                    error = f"status: {response.status}"
            except (OSError, http.client.HTTPException, AssertionError, ValueError) as exc:
                error = f"{type(exc).__name__}: {exc}"[:300]
                conn.close()
                conn = None
            finished = time.monotonic()
            with self._lock:
                self.result.timeline.append((started, sent, finished, error))
                if error:
                    self.result.failures.append(error)
                else:
                    self.result.ok += 1
                    self.result.latencies.append(finished - started)
            if error and self.stop_on_refused and "Refused" in error:
                break
        if conn is not None:
            conn.close()

    def start(self) -> Load:
        self._started = time.monotonic()
        deadline = self._started + self.seconds
        self._workers = [threading.Thread(target=self._run, args=(deadline,), daemon=True)
                         for _ in range(self.threads)]
        for worker in self._workers:
            worker.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def join(self) -> LoadResult:
        for worker in self._workers:
            worker.join(self.seconds + self.timeout + 30)
        self.result.seconds = time.monotonic() - self._started
        return self.result

    def run(self) -> LoadResult:
        return self.start().join()


def slow_client(server: Server, stage: str) -> socket.socket:
    """A connection stalled part-way: `tcp` (nothing sent), `hello` (half a TLS ClientHello), `headers` (TLS done,
    half the request line and headers), `body` (headers done, half the body)."""
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    if stage == "tcp":
        return raw
    if stage == "hello":
        # A TLS 1.2 ClientHello record header promising 512 bytes, then only a few of them.
        raw.sendall(bytes([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xFC, 0x03, 0x03]) + os.urandom(16))
        return raw
    tls = server.context().wrap_socket(raw, server_hostname="localhost")
    if stage == "headers":
        tls.sendall(b"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Ty")
    else:
        tls.sendall(b"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 4000\r\n\r\n{\"apiVersion\":")
    return tls


def timed_review(server: Server, conn: http.client.HTTPSConnection | None = None,
                 timeout: float = 10) -> tuple[float, str]:
    """One review, on `conn` or a fresh connection; (seconds, error or "")."""
    path, body = sample_bodies()[0]
    own = conn is None
    conn = conn or server.connection(timeout=timeout)
    started = time.monotonic()
    try:
        status, data = server.post(path, body, conn)
        check_http_answer(body, status, data)
        return time.monotonic() - started, ""
    except (OSError, http.client.HTTPException, AssertionError, ValueError) as exc:
        return time.monotonic() - started, f"{type(exc).__name__}: {exc}"
    finally:
        if own:
            conn.close()
