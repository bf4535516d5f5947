"""The web app: HTTP in and out, nothing decided here.

The two review endpoints (POST /mutate, POST /validate) are answered straight from the WSGI environ, in front of
Flask: a review is bytes in and bytes out, and Flask's request and response machinery (contexts, routing, signals,
header objects) cost more CPU per review than the decision itself. Everything else (probes, /metrics, every error
page, any other method or path) is Flask's.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from flask import Flask, Response

from gpufrac.core.jsonlog import log_context
from gpufrac.webhook.decide import admission
from gpufrac.webhook.decide.errors import BadReviewError
from gpufrac.webhook.decide.policy import Policy
from gpufrac.webhook.decide.review import ReviewRequest, build_response, parse_review
from gpufrac.webhook.serve import metrics

# Two pods' worth of JSON (object and oldObject) at the API server's 3 MiB object limit, with room to spare.
MAX_BODY_BYTES = 8 * 1024 * 1024
# Decoding a review takes several times its size in memory (about 8 times for a pod of many small objects, such as
# a long env list): reviews over this size are decoded one at a time in the whole server, so the server's memory
# is its idle size plus one large review, whatever the workers and threads. Smaller ones (every ordinary pod) never
# wait. A large review that cannot get its turn in LARGE_REVIEW_WAIT_SECONDS is answered 503.
LARGE_REVIEW_BYTES = 1024 * 1024
LARGE_REVIEW_WAIT_SECONDS = 2.0
# Set in the WSGI environ when a body was refused unread: the server then closes the connection the careful way
# (server.py: answer, stop writing, drain what the client still sends) so the client reads the 413.
REFUSED_BODY = "gpufrac.refused_body"
log = logging.getLogger("gpufrac.webhook")

StartResponse = Callable[..., Any]
Decide = Callable[[ReviewRequest, Policy], admission.Outcome]

_JSON = ("Content-Type", "application/json")
_STATUS = {200: "200 OK", 400: "400 Bad Request", 405: "405 Method Not Allowed", 413: "413 Content Too Large",
           500: "500 Internal Server Error", 503: "503 Service Unavailable"}
_TOO_LARGE = f"the body is larger than {MAX_BODY_BYTES} bytes"
_NOT_JSON = "the body is not JSON; send an AdmissionReview (admission.k8s.io/v1)"
_PATHS = "POST /mutate or /validate, GET /healthz, /readyz or /metrics"
_BUSY = (f"busy with other reviews over {LARGE_REVIEW_BYTES} bytes, which are answered one at a time; "
         "retry")


def _dumps(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def _json(body: Any, status: int = 200) -> Response:
    return Response(_dumps(body), status=status, mimetype="application/json")


def _error(status: int, message: str) -> Response:
    return _json({"error": message, "code": status}, status)


class _RefusedError(Exception):
    """A review answered with a JSON error instead of an AdmissionReview."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class LargeReviewGate:
    """One large review at a time: across threads with a lock, across the server's worker processes with an
    flock(2) on `path` (the kernel lets go of it when a process dies holding it). No path: this process only."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid = 0

    def _file(self) -> int:
        if self._pid != os.getpid():  # each worker its own open file, so that the flock excludes the others
            assert self.path is not None
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            self._pid = os.getpid()
        assert self._fd is not None
        return self._fd

    @contextmanager
    def turn(self) -> Iterator[None]:
        deadline = time.monotonic() + LARGE_REVIEW_WAIT_SECONDS
        if not self._lock.acquire(timeout=LARGE_REVIEW_WAIT_SECONDS):
            raise _RefusedError(503, _BUSY)
        try:
            fd = self._file() if self.path is not None else None
            while fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise _RefusedError(503, _BUSY) from None
                    time.sleep(0.005)
            try:
                yield
            finally:
                _give_back_memory()  # while the turn is held: the next large review starts from the idle size
                if fd is not None:
                    fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            self._lock.release()


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
        return trim
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _malloc_trim()


def _give_back_memory() -> None:
    """Return the heap a large review freed to the system: glibc keeps it for the thread that used it, so
    each thread in turn would keep the size of the largest review it decoded."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _declared_length(environ: dict[str, Any]) -> int | None:
    length = environ.get("CONTENT_LENGTH")
    if not length:
        return None
    try:
        return int(length)
    except ValueError:
        raise _RefusedError(400, "the Content-Length header is not a number") from None


def _read_body(environ: dict[str, Any]) -> bytes:
    """The request body, refused unread (413) when its Content-Length is over the limit; a chunked body is read
    one byte past the limit, so one that is too long is seen to be, not cut."""
    size = _declared_length(environ)
    stream: BinaryIO = environ["wsgi.input"]
    if size is not None:
        if size > MAX_BODY_BYTES:
            environ[REFUSED_BODY] = True
            raise _RefusedError(413, _TOO_LARGE)
        return stream.read(size) if size > 0 else b""
    raw = stream.read(MAX_BODY_BYTES + 1)
    if len(raw) > MAX_BODY_BYTES:
        environ[REFUSED_BODY] = True
        raise _RefusedError(413, _TOO_LARGE)
    return raw


def _restart_client_deadline(environ: dict[str, Any]) -> None:
    """A client has a deadline to send its request (tls.DeadlineSSLSocket); time spent waiting for the
    large-review turn is the server's, not the client's."""
    restart = getattr(environ.get("gunicorn.socket"), "restart_deadline", None)
    if restart is not None:
        restart()


def _discard_body(environ: dict[str, Any], size: int) -> None:
    stream: BinaryIO = environ["wsgi.input"]
    while size > 0:
        chunk = stream.read(min(size, 64 * 1024))
        if not chunk:
            return
        size -= len(chunk)


class ReviewEndpoints:
    """WSGI: /mutate and /validate routed here, and only here (POST answered, any other method 405), anything else
    passed to `fallback` (the Flask app)."""

    def __init__(self, policy: Policy, fallback: Callable[[dict[str, Any], StartResponse], Iterable[bytes]],
                 gate: LargeReviewGate) -> None:
        self.policy = policy
        self.fallback = fallback
        self.gate = gate
        self.endpoints: dict[str, tuple[str, Decide]] = {
            "/mutate": ("mutate", admission.mutate), "/validate": ("validate", admission.validate)}

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        endpoint = self.endpoints.get(environ.get("PATH_INFO", ""))
        if endpoint is None:
            return self.fallback(environ, start_response)
        wrong_method = environ.get("REQUEST_METHOD") != "POST"
        status, body = (405, _dumps({"error": f"method not allowed: {_PATHS}", "code": 405})) if wrong_method \
            else self.review(environ, *endpoint)
        headers = [_JSON, ("Content-Length", str(len(body)))]
        if wrong_method:
            headers.append(("Allow", "POST"))
        if environ.get(REFUSED_BODY):
            headers.append(("Connection", "close"))
        start_response(_STATUS[status], headers)
        return [body]

    def review(self, environ: dict[str, Any], endpoint: str, decide: Decide) -> tuple[int, bytes]:
        """The answer to one review (status, JSON body), counted and logged in one line with its uid and, for a
        denial or an error, the reason. A client that goes away mid-body raises OSError for gunicorn to close."""
        started = time.perf_counter()
        note = _Note()
        try:
            return 200, self._decide(environ, endpoint, decide, note)
        except _RefusedError as refused:
            note.reason = refused.message
            return refused.status, _dumps({"error": refused.message, "code": refused.status})
        except OSError as exc:
            note.reason = f"the body was not read: {exc}"
            raise
        except Exception:
            log.exception("unexpected error answering a review", extra={"endpoint": endpoint, "uid": note.uid})
            return 500, _dumps({"error": "internal error; see the webhook log", "code": 500})
        finally:
            elapsed = time.perf_counter() - started
            metrics.observe(endpoint, note.result, elapsed)
            if log.isEnabledFor(logging.INFO):
                review = note.review
                log.info("review", extra={
                    "endpoint": endpoint, "result": note.result, "uid": note.uid, "ms": round(elapsed * 1000, 3),
                    "reason": note.reason,
                    "operation": review.operation if review else "", "namespace": review.namespace if review else "",
                    "pod": review.name if review else "", "user": review.user.username if review else "",
                })

    def _decide(self, environ: dict[str, Any], endpoint: str, decide: Decide, note: _Note) -> bytes:
        declared = _declared_length(environ)
        if declared is not None and LARGE_REVIEW_BYTES < declared <= MAX_BODY_BYTES:
            try:
                with self.gate.turn():  # before reading: a waiting body stays in the socket, not in memory
                    _restart_client_deadline(environ)
                    return self._judge(_read_body(environ), endpoint, decide, note)
            except _RefusedError as refused:
                if refused.status == 503:  # read past it, so the connection stays usable
                    _restart_client_deadline(environ)
                    _discard_body(environ, declared)
                raise
        raw = _read_body(environ)
        if len(raw) > LARGE_REVIEW_BYTES:  # chunked: its size is known once read
            with self.gate.turn():
                return self._judge(raw, endpoint, decide, note)
        return self._judge(raw, endpoint, decide, note)

    def _judge(self, raw: bytes, endpoint: str, decide: Decide, note: _Note) -> bytes:
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            raise _RefusedError(400, _NOT_JSON) from None
        try:
            note.review = parse_review(body)
            note.uid = note.review.uid
            with log_context(uid=note.uid):  # every line logged while deciding names the review
                outcome = decide(note.review, self.policy)
        except BadReviewError as exc:
            raise _RefusedError(exc.status, exc.message) from None
        except RecursionError:
            raise _RefusedError(400, "the object is nested too deeply") from None
        note.result = "allowed" if outcome.allowed else "denied"
        note.reason = outcome.message
        metrics.count_denials(endpoint, outcome.violations)
        return _dumps(build_response(note.uid, allowed=outcome.allowed, message=outcome.message,
                                     patch=outcome.patch, warnings=outcome.warnings))


@dataclass
class _Note:
    """What the log line says of a review."""

    result: str = "error"
    uid: str = ""
    reason: str = ""
    review: ReviewRequest | None = None


def create_app(policy: Policy, large_review_lock: Path | None = None) -> Flask:
    """`large_review_lock`: a file all of the server's worker processes can lock (see LargeReviewGate). The reviews
    are routed by ReviewEndpoints in front of Flask; Flask routes the probes, /metrics and every error page."""
    app = Flask("gpufrac")
    # Flask serves no review; for anything else posted, the same limit (one byte over, for chunked bodies).
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES + 1
    endpoints = ReviewEndpoints(policy, app.wsgi_app, LargeReviewGate(large_review_lock))
    app.wsgi_app = endpoints  # type: ignore[method-assign]
    app.add_url_rule("/healthz", "healthz", lambda: _json({"status": "ok"}))
    app.add_url_rule("/readyz", "readyz", lambda: _json({"status": "ready"}))
    app.add_url_rule("/metrics", "metrics", lambda: Response(metrics.render(), mimetype="text/plain; version=0.0.4"))
    for status, page in _ERROR_PAGES.items():
        app.register_error_handler(status, page)
    return app


def _internal_error(_: Exception) -> Response:
    log.exception("unexpected error answering a review")
    return _error(500, "internal error; see the webhook log")


_ERROR_PAGES: dict[int, Callable[[Exception], Response]] = {
    413: lambda _: _error(413, _TOO_LARGE),
    404: lambda _: _error(404, f"not found: {_PATHS}"),
    405: lambda _: _error(405, f"method not allowed: {_PATHS}"),
    500: _internal_error,
}
