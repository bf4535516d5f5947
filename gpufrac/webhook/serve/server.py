"""Serve the app on gunicorn over TLS: gthread workers, long keep-alive, certificates re-read when rotated."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import shutil
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gunicorn import glogging
from gunicorn.app.base import BaseApplication
from gunicorn.workers import gthread

from gpufrac.core.jsonlog import log_config
from gpufrac.webhook.decide.policy import Policy

if TYPE_CHECKING:
    from gpufrac.probes.server import ProbeServer

KEEPALIVE_SECONDS = 95  # the API server keeps idle connections for 90 s; outlive it so it never hits a closed one


# A review arrives in one piece from the API server; a client that takes longer than this to finish its TLS
# handshake, or to send one request, is cut off so it cannot hold one of a worker's few threads.
CLIENT_DEADLINE_SECONDS = 1.0
# How long a thread that answered a request waits on its kept-alive connection for the next one
# (LingeringThreadWorker): longer than the API server takes between a pod's two reviews and, at one client,
# between two pods.
LINGER_SECONDS = 0.02
# How long gunicorn lets a new connection that sent nothing yet hold a thread before parking it in the poller
# (gunicorn's default is 5 s: a few idle connections would delay every review past the webhook timeout).
IDLE_CONNECTION_WAIT_SECONDS = 0.5
# A connection closed after its answer (a body refused unread, or `Connection: close`) is drained this long at
# most, and this much at most, so the client that is still sending gets to read the answer.
CLOSING_DRAIN_SECONDS = 2.0
CLOSING_DRAIN_BYTES = 32 * 1024 * 1024
# In the metrics directory: the file whose flock makes large reviews take turns across workers (app.LargeReviewGate).
LARGE_REVIEW_LOCK = "large-review.lock"
log = logging.getLogger("gpufrac.webhook")


class DeadlineSSLSocket(ssl.SSLSocket):
    """A server-side TLS socket whose blocking reads stop at a per-request deadline (a stalled or trickling client
    gets cut off, not waited for). gunicorn switches the socket to blocking for each request it reads."""

    _deadline: float | None = None
    _cut = False  # closed by us: gunicorn's close must not linger on it (see shutdown)

    def _start_deadline(self) -> None:
        self._deadline = time.monotonic() + CLIENT_DEADLINE_SECONDS
        self.settimeout(CLIENT_DEADLINE_SECONDS)

    def restart_deadline(self) -> None:
        """The rest of the request gets its own time from now (the app held it back, waiting for its turn)."""
        if self._deadline is not None:
            self._start_deadline()

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
        # being slow would make it linger in turn, and stall every new connection of the worker meanwhile. A
        # connection already drained on its worker thread (close_after_answer) has nothing left to linger for.
        if self._cut:
            raise OSError(errno.ENOTCONN, "cut off or drained already: closed without lingering")
        super().shutdown(how)


def close_after_answer(sock: socket.socket) -> None:
    """Close a connection whose answer is written, the way Go's net/http does, on the worker thread: stop writing
    (FIN after the answer), then read and drop what the client still sends (the rest of a body refused unread)
    until it closes, for a bounded time and size. A client that sends its whole body before it reads (Python's
    requests, any client without `Expect: 100-continue`) then reads the answer instead of a reset; and gunicorn's
    own close on the accept thread finds nothing to wait for, so no other connection waits on this one.

    The drained bytes are read from the socket under TLS, undecrypted: nothing more is read from this session.
    """
    try:
        socket.socket.shutdown(sock, socket.SHUT_WR)  # the TCP socket's, not the TLS layer's (no more records)
    except OSError:
        return
    finally:
        if isinstance(sock, DeadlineSSLSocket):
            sock._cut = True
    deadline = time.monotonic() + CLOSING_DRAIN_SECONDS
    buffer = bytearray(256 * 1024)
    drained = 0
    try:
        while drained < CLOSING_DRAIN_BYTES:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            socket.socket.settimeout(sock, remaining)
            n = socket.socket.recv_into(sock, buffer)
            if n == 0:
                break
            drained += n
    except OSError:
        pass


def _declares_no_length(req: Any) -> bool:
    """A request with a body of no declared length (chunked), which the app may refuse part-read."""
    return not any(name == "CONTENT-LENGTH" for name, _ in req.headers) and any(
        name == "TRANSFER-ENCODING" for name, _ in req.headers)


def _closing_before_answer(max_body_bytes: int) -> Callable[[Any, Any], None]:
    """gunicorn's pre_request hook: the requests whose connection closes after the answer, said so in its
    headers (gunicorn decides them from the request): a declared body over the limit, refused unread, and every
    chunked one, which the app may refuse part-read (rare: the API server always sends a Content-Length)."""

    def pre_request(_worker: Any, req: Any) -> None:
        if _declares_no_length(req):
            req.force_close()
            return
        for name, value in req.headers:
            if name == "CONTENT-LENGTH" and value.isdigit() and int(value) > max_body_bytes:
                req.force_close()

    return pre_request


def _post_request(_worker: Any, _req: Any, _environ: dict[str, Any], resp: Any) -> None:
    """Runs on the worker thread after the app: a connection that closes after its answer is closed here (one
    whose request failed before an answer is gunicorn's to close)."""
    if resp is not None and resp.headers_sent and resp.should_close():
        close_after_answer(resp.sock)


class LingeringThreadWorker(gthread.ThreadWorker):  # type: ignore[misc]
    """gunicorn's gthread worker, with one change: a thread that has answered a request on a kept-alive
    connection waits up to LINGER_SECONDS on that connection for the next request before handing it back.

    The API server sends a pod's validating review right after its mutating one, on the same connection. Handed
    back, each request costs three thread hand-offs (the main thread's epoll, the pool's queue, the wake-up pipe
    back) with their syscalls, and on a busy machine a scheduler wait at each. A thread lingers only while the
    worker has fewer connections than threads: then every other connection, and a new one, still finds a free
    thread, and under more connections than threads this is gthread as it was.
    """

    def handle(self, conn: Any) -> Any:
        result = super().handle(conn)
        while result is True and self.alive and self._next_request_arrives(conn):
            result = super().handle(conn)
        return result

    def _next_request_arrives(self, conn: Any) -> bool:
        if conn.parser.unreader.buf.getvalue() or getattr(conn.sock, "pending", lambda: 0)():
            return True  # read ahead already
        if self.nr_conns >= self.cfg.threads:
            return False  # a thread per connection no longer: hand it back, as gthread does
        try:
            poller = select.poll()
            poller.register(conn.sock.fileno(), select.POLLIN)
            return bool(poller.poll(LINGER_SECONDS * 1000))
        except (OSError, ValueError):
            return False


class QuietAccessLogger(glogging.Logger):  # type: ignore[misc]
    """gunicorn's logger, building access-log data only when the access logger would write it: with
    `logconfig_dict`, gunicorn builds it for every request and the level (WARNING) then drops it."""

    def _compute_access_log_enabled(self) -> bool:
        return bool(super()._compute_access_log_enabled() and self.access_log.isEnabledFor(logging.INFO))

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        self._access_log_enabled = self._compute_access_log_enabled()


class LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """One write(2) per log line. A line up to PIPE_BUF bytes is written whole by the kernel even when other
    threads write at the same time (stdout is a pipe in a container), so it takes no lock: review threads do not
    queue behind each other's writes. Longer lines take the handler's lock."""

    def handle(self, record: logging.LogRecord) -> bool:
        if not self.filter(record):
            return False
        try:
            line = (self.format(record) + "\n").encode("utf-8", "backslashreplace")
            fd = self.stream.fileno()
            if len(line) <= select.PIPE_BUF:
                os.write(fd, line)
                return True
            with self.lock:  # type: ignore[union-attr]
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view):]
        except Exception:
            self.handleError(record)
        return True


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
    log_format: str = "json"  # or text (gpufrac.core.jsonlog.FORMATS)
    # HOST:PORT of the plain-HTTP metrics listener (gpufrac.probes.server); "" = none.
    metrics_bind: str = ""


def _log_config(level: str, fmt: str = "json") -> dict[str, Any]:
    """The one log format (gpufrac.core.jsonlog) on stdout, through LineHandler; gunicorn's own lines too."""
    config = log_config(level, "ext://sys.stdout", fmt)
    config["handlers"]["json"]["class"] = f"{__name__}.LineHandler"
    config["loggers"].update({
        "gunicorn.error": {"level": level.upper(), "handlers": ["json"], "propagate": False},
        "gunicorn.access": {"level": "WARNING", "handlers": ["json"], "propagate": False},
    })
    return config


class WebhookServer(BaseApplication):  # type: ignore[misc]
    def __init__(self, policy: Policy, options: ServeOptions, metrics_dir: Path) -> None:
        self.policy = policy
        self.options = options
        self.metrics_dir = metrics_dir
        super().__init__()

    def load_config(self) -> None:
        from gpufrac.webhook.serve.app import MAX_BODY_BYTES  # after prepare_metrics_dir: it imports prometheus_client
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
            "worker_class": f"{__name__}.LingeringThreadWorker",
            "keepalive": KEEPALIVE_SECONDS,
            "timeout": 30,
            "graceful_timeout": o.graceful_timeout,
            "certfile": str(o.certs_dir / "tls.crt"),
            "keyfile": str(o.certs_dir / "tls.key"),
            "ssl_context": reloader,
            "logconfig_dict": _log_config(o.log_level, o.log_format),
            "child_exit": child_exit,
            "pre_request": _closing_before_answer(MAX_BODY_BYTES),
            "post_request": _post_request,
            "logger_class": QuietAccessLogger,
            # The app is imported once, in the master; the workers share its pages.
            "preload_app": True,
            "proc_name": "gpufrac-webhook",
            # Workers are never recycled after a number of requests: nothing leaks, and a recycle drops connections.
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
        # A log record needs no caller, thread or process lookup: our formatter writes none of them.
        logging._srcfile = None
        logging.logThreads = False
        logging.logProcesses = False
        logging.logMultiprocessing = False

    def load(self) -> Any:
        from gpufrac.webhook.serve.app import create_app
        return create_app(self.policy, large_review_lock=self.metrics_dir / LARGE_REVIEW_LOCK)


def metrics_server(bind: str, certs_dir: Path) -> ProbeServer:
    """The metrics on their own plain-HTTP port, served by the master: it reads every worker's values from the
    multiprocess directory, and the expiry of the certificates the workers serve."""
    from gpufrac.probes.server import ProbeServer
    from gpufrac.webhook.serve import metrics

    return ProbeServer(bind, lambda: metrics.render([metrics.CertificateCollector(certs_dir)]),
                       {"/healthz": lambda: (True, "ok")})


def _metrics_listener_starter(bind: str, certs_dir: Path) -> Any:
    def when_ready(_server: Any) -> None:  # in the master, once the admission port is bound
        server = metrics_server(bind, certs_dir).start()
        log.info("metrics", extra={"bind": server.host, "port": server.port})
    return when_ready


# Where prometheus_client's multiprocess files go when $PROMETHEUS_MULTIPROC_DIR is unset: made, and removed, here.
_MADE_METRICS_DIR: Path | None = None


def prepare_metrics_dir() -> Path:
    """Point prometheus_client at a directory shared by the workers, without an earlier run's values.

    Must run before anything imports prometheus_client: it picks its multiprocess mode once, at import. A directory
    named by $PROMETHEUS_MULTIPROC_DIR is the operator's: only the files the server writes there are removed.
    """
    global _MADE_METRICS_DIR
    if "prometheus_client" in sys.modules:
        raise RuntimeError("prometheus_client was imported before the webhook chose its metrics mode")
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        metrics_dir = Path(given)
        metrics_dir.mkdir(parents=True, exist_ok=True)
        _remove_server_files(metrics_dir)  # values of workers from an earlier run must not be summed in
    else:
        metrics_dir = _MADE_METRICS_DIR = Path(tempfile.mkdtemp(prefix="gpufrac-metrics-"))
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    return metrics_dir


def _remove_server_files(metrics_dir: Path) -> None:
    """prometheus_client's per-process files (*.db) and the large-review lock; nothing else in the directory."""
    for path in [*metrics_dir.glob("*.db"), metrics_dir / LARGE_REVIEW_LOCK]:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def serve(policy: Policy, options: ServeOptions, metrics_dir: Path) -> None:
    """Run until SIGTERM/SIGINT; in-flight reviews finish within graceful_timeout."""
    try:
        WebhookServer(policy, options, metrics_dir).run()
    finally:
        if metrics_dir == _MADE_METRICS_DIR:
            shutil.rmtree(metrics_dir, ignore_errors=True)
        else:
            _remove_server_files(metrics_dir)
