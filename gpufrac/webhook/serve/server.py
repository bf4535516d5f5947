"""Serve the app on gunicorn over TLS, on gunicorn's public surface only: a `BaseApplication` configured through
`cfg.set`, an `fd://` bind (listener.py), the `gthread` worker class, the `ssl_context`, `pre_request`,
`post_request`, `child_exit` and `when_ready` server hooks, and the `logger_class` and `logconfig_dict` settings
(tests/lint/test_public_api.py keeps it so)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gunicorn import glogging
from gunicorn.app.base import BaseApplication

from gpufrac.webhook.decide.policy import Policy
from gpufrac.webhook.serve.listener import listening_fd
from gpufrac.webhook.serve.serverlog import server_log_config, skip_record_lookups
from gpufrac.webhook.serve.tls import CertificateReloader, close_after_answer

if TYPE_CHECKING:
    from gpufrac.probes.server import ProbeServer

KEEPALIVE_SECONDS = 95  # the API server keeps idle connections for 90 s; outlive it so it never hits a closed one

# In the metrics directory: the file whose flock makes large reviews take turns across workers (app.LargeReviewGate).
LARGE_REVIEW_LOCK = "large-review.lock"
# Settings an older gunicorn release does not have, and does not need: it has no control socket to disable.
NEWER_SETTINGS = frozenset({"control_socket_disable"})
log = logging.getLogger("gpufrac.webhook")


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


class AccessLogger(glogging.Logger):  # type: ignore[misc]
    """gunicorn's logger (the `logger_class` setting), building access-log data only when the access logger would
    write it: with `logconfig_dict`, gunicorn builds it for every request and the level (WARNING) then drops it.
    `access` is the method gunicorn calls per request, on every version."""

    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: Any) -> None:
        if self.access_log.isEnabledFor(logging.INFO):
            super().access(resp, req, environ, request_time)


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


class WebhookServer(BaseApplication):  # type: ignore[misc]
    def __init__(self, policy: Policy, options: ServeOptions, metrics_dir: Path) -> None:
        self.policy = policy
        self.options = options
        self.metrics_dir = metrics_dir
        self.listener_fd: int | None = None  # made once: a configuration reload keeps gunicorn's listener
        super().__init__()

    def load_config(self) -> None:
        from gpufrac.webhook.serve.app import MAX_BODY_BYTES  # after prepare_metrics_dir: it imports prometheus_client
        o = self.options
        reloader = CertificateReloader(o.certs_dir / "tls.crt", o.certs_dir / "tls.key")
        reloader.context()  # fail at start, with the reason, if the certificates are unusable
        metrics_dir = str(self.metrics_dir)
        if self.listener_fd is None:
            self.listener_fd = listening_fd(o.bind)

        def child_exit(_server: Any, worker: Any) -> None:
            from prometheus_client import multiprocess
            multiprocess.mark_process_dead(worker.pid, metrics_dir)  # type: ignore[no-untyped-call]

        settings = {
            "bind": [f"fd://{self.listener_fd}"],  # o.bind, with TCP_DEFER_ACCEPT (listener.py)
            "workers": o.workers,
            "threads": o.threads,
            # gunicorn's own threaded worker, unchanged: a thread hands a kept-alive connection back to the
            # worker's poller after each answer (docs/performance.md, "The server on gunicorn's public surface").
            "worker_class": "gthread",
            "keepalive": KEEPALIVE_SECONDS,
            "timeout": 30,
            "graceful_timeout": o.graceful_timeout,
            "certfile": str(o.certs_dir / "tls.crt"),
            "keyfile": str(o.certs_dir / "tls.key"),
            "ssl_context": reloader,
            "logconfig_dict": server_log_config(o.log_level, o.log_format),
            "child_exit": child_exit,
            "pre_request": _closing_before_answer(MAX_BODY_BYTES),
            "post_request": _post_request,
            "logger_class": AccessLogger,
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
            if key in self.cfg.settings or key not in NEWER_SETTINGS:
                self.cfg.set(key, value)  # an unknown name is an error, as it should be
        skip_record_lookups()

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
