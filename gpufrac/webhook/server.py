"""Serve the app on gunicorn over TLS: gthread workers, long keep-alive, certificates re-read when rotated."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import ssl
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.workers import gthread

from gpufrac.webhook.policy import Policy

KEEPALIVE_SECONDS = 95  # the API server keeps idle connections for 90 s; outlive it so it never hits a closed one


# A review arrives in one piece from the API server; a client that takes longer than this to finish its TLS
# handshake, or to send one request, is cut off so it cannot hold one of a worker's few threads.
CLIENT_DEADLINE_SECONDS = 1.0
# How long gunicorn lets a new connection that sent nothing yet hold a thread before parking it in the poller
# (gunicorn's default is 5 s: a few idle connections would delay every review past the webhook timeout).
IDLE_CONNECTION_WAIT_SECONDS = 0.5
log = logging.getLogger("gpufrac.webhook")


class DeadlineSSLSocket(ssl.SSLSocket):
    """A server-side TLS socket whose blocking reads stop at a per-request deadline (a stalled or trickling client
    gets cut off, not waited for). gunicorn switches the socket to blocking for each request it reads."""

    _deadline: float | None = None
    _cut = False

    def _start_deadline(self) -> None:
        self._deadline = time.monotonic() + CLIENT_DEADLINE_SECONDS
        self.settimeout(CLIENT_DEADLINE_SECONDS)

    def setblocking(self, flag: bool) -> None:
        if flag:
            self._start_deadline()
        else:
            self._deadline = None
            super().setblocking(False)

    def _cut_off(self, stage: str) -> ConnectionResetError:
        self._cut = True
        try:
            peer: object = self.getpeername()
        except OSError:
            peer = "?"
        log.warning("dropped a slow client", extra={"peer": str(peer), "stage": stage})
        # gunicorn closes a reset connection quietly; any other socket error would be logged with a traceback.
        return ConnectionResetError(errno.ECONNRESET, f"no complete {stage} within {CLIENT_DEADLINE_SECONDS} s")

    def _before_read(self) -> None:
        if self._deadline is None:
            return
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise self._cut_off("request")
        self.settimeout(remaining)

    def do_handshake(self, block: bool = False) -> None:
        self._start_deadline()  # gunicorn wraps a blocking socket, which would wait for ever
        try:
            super().do_handshake(block)
        except TimeoutError:
            raise self._cut_off("TLS handshake") from None
        self._start_deadline()  # the first request gets its own time

    def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
        self._before_read()
        try:
            return super().recv(buflen, flags)
        except TimeoutError:
            raise self._cut_off("request") from None

    def recv_into(self, buffer: Any, nbytes: int | None = None, flags: int = 0) -> int:
        self._before_read()
        try:
            return super().recv_into(buffer, nbytes, flags)
        except TimeoutError:
            raise self._cut_off("request") from None

    def sendall(self, data: Any, flags: int = 0) -> None:
        if self._deadline is not None:
            self.settimeout(CLIENT_DEADLINE_SECONDS)  # the answer gets its own time, whatever reading took
        super().sendall(data, flags)

    def shutdown(self, how: int) -> None:
        # gunicorn closes "gracefully" on its accept thread, lingering for the peer to close; a client cut off for
        # being slow would make it linger in turn, and stall every new connection of the worker meanwhile.
        if self._cut:
            raise OSError(errno.ENOTCONN, "cut off as too slow: closed without lingering")
        super().shutdown(how)


class CertificateReloader:
    """An SSL context factory that rebuilds the context when tls.crt or tls.key change on disk.

    gunicorn asks for a context on every accepted connection; building one costs a file read and key parse, so it
    is cached and rebuilt only when the files change (a Secret update swaps them atomically). A cert and key
    caught mid-rotation that do not match keep the previous context until the pair is whole again.
    """

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self._lock = threading.Lock()
        self._stamp: tuple[Any, ...] | None = None
        self._context: ssl.SSLContext | None = None

    def _files_stamp(self) -> tuple[Any, ...]:
        stats = [os.stat(f) for f in (self.cert_file, self.key_file)]
        return tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in stats)

    def _build(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.sslsocket_class = DeadlineSSLSocket
        context.load_cert_chain(certfile=str(self.cert_file), keyfile=str(self.key_file))
        return context

    def context(self) -> ssl.SSLContext:
        with self._lock:
            try:
                stamp = self._files_stamp()
                if stamp != self._stamp or self._context is None:
                    self._context = self._build()
                    self._stamp = stamp
            except (OSError, ssl.SSLError):
                if self._context is None:
                    raise
            return self._context

    def __call__(self, _conf: Any, _default_factory: Any) -> ssl.SSLContext:
        return self.context()


@dataclass(frozen=True)
class ServeOptions:
    certs_dir: Path
    bind: str
    workers: int = 2
    threads: int = 8
    graceful_timeout: int = 20
    log_level: str = "info"
    # HOST:PORT of the plain-HTTP metrics listener (gpufrac.webhook.metrics_port); "" = none.
    metrics_bind: str = ""


def _log_config(level: str) -> dict[str, Any]:
    fmt = "%(asctime)s %(levelname)s %(name)s %(message)s"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "gpufrac.core.jsonlog.JsonFormatter", "format": fmt}},
        "handlers": {"stdout": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stdout"}},
        "root": {"level": level.upper(), "handlers": ["stdout"]},
        "loggers": {
            "gunicorn.error": {"level": level.upper(), "handlers": ["stdout"], "propagate": False},
            "gunicorn.access": {"level": "WARNING", "handlers": ["stdout"], "propagate": False},
        },
    }


class WebhookServer(BaseApplication):  # type: ignore[misc]
    def __init__(self, policy: Policy, options: ServeOptions, metrics_dir: Path) -> None:
        self.policy = policy
        self.options = options
        self.metrics_dir = metrics_dir
        super().__init__()

    def load_config(self) -> None:
        o = self.options
        reloader = CertificateReloader(o.certs_dir / "tls.crt", o.certs_dir / "tls.key")
        reloader.context()  # fail at start, with the reason, if the certificates are unusable
        metrics_dir = str(self.metrics_dir)

        def child_exit(_server: Any, worker: Any) -> None:
            from prometheus_client import multiprocess
            multiprocess.mark_process_dead(worker.pid, metrics_dir)  # type: ignore[no-untyped-call]

        settings = {
            "bind": [o.bind],
            "workers": o.workers,
            "threads": o.threads,
            "worker_class": "gthread",
            "keepalive": KEEPALIVE_SECONDS,
            "timeout": 30,
            "graceful_timeout": o.graceful_timeout,
            "certfile": str(o.certs_dir / "tls.crt"),
            "keyfile": str(o.certs_dir / "tls.key"),
            "ssl_context": reloader,
            "logconfig_dict": _log_config(o.log_level),
            "child_exit": child_exit,
            "proc_name": "gpufrac-webhook",
            # A worker that stops answering is replaced; a request never waits on a dead one.
            "max_requests": 0,
            "limit_request_line": 8190,
            # gunicorn's control socket defaults to one path per user, shared by every instance; we do not use it.
            "control_socket_disable": True,
        }
        if o.metrics_bind:
            settings["when_ready"] = _metrics_listener_starter(o.metrics_bind, o.certs_dir)
        for key, value in settings.items():
            self.cfg.set(key, value)
        gthread.DEFAULT_WORKER_DATA_TIMEOUT = IDLE_CONNECTION_WAIT_SECONDS  # gunicorn reads it per connection

    def load(self) -> Any:
        from gpufrac.webhook.app import create_app
        return create_app(self.policy)


def _metrics_listener_starter(bind: str, certs_dir: Path) -> Any:
    def when_ready(_server: Any) -> None:  # in the master, once the admission port is bound
        from gpufrac.webhook.metrics_port import MetricsListener
        MetricsListener(bind, certs_dir).start()
    return when_ready


def prepare_metrics_dir() -> Path:
    """Point prometheus_client at a fresh directory shared by the workers.

    Must run before anything imports prometheus_client: it picks its multiprocess mode once, at import.
    """
    if "prometheus_client" in sys.modules:
        raise RuntimeError("prometheus_client was imported before the webhook chose its metrics mode")
    metrics_dir = Path(os.environ.get("PROMETHEUS_MULTIPROC_DIR") or tempfile.mkdtemp(prefix="gpufrac-metrics-"))
    # A fresh directory each start: values of workers from an earlier run must not be summed in.
    shutil.rmtree(metrics_dir, ignore_errors=True)
    metrics_dir.mkdir(parents=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    return metrics_dir


def serve(policy: Policy, options: ServeOptions, metrics_dir: Path) -> None:
    """Run until SIGTERM/SIGINT; in-flight reviews finish within graceful_timeout."""
    try:
        WebhookServer(policy, options, metrics_dir).run()
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
