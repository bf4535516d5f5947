"""The Flask app: HTTP in and out, nothing decided here."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, request

from gpufrac.webhook import admission, metrics
from gpufrac.webhook.errors import BadReviewError
from gpufrac.webhook.policy import Policy
from gpufrac.webhook.review import ReviewRequest, build_response, parse_review

# Two pods' worth of JSON (object and oldObject) at the API server's 3 MiB object limit, with room to spare.
MAX_BODY_BYTES = 8 * 1024 * 1024
log = logging.getLogger("gpufrac.webhook")


def _json(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body, separators=(",", ":")), status=status, mimetype="application/json")


def _error(status: int, message: str) -> Response:
    return _json({"error": message, "code": status}, status)


def create_app(policy: Policy) -> Flask:
    app = Flask("gpufrac")
    # One byte over the limit, so a chunked body (no Content-Length) that is too long is seen to be, not cut.
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES + 1

    def serve(endpoint: str, decide: Callable[[ReviewRequest, Policy], admission.Outcome]) -> Response:
        started = time.perf_counter()
        result, uid, review = "error", "", None
        try:
            if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
                return _error(413, f"the body is larger than {MAX_BODY_BYTES} bytes")
            raw = request.get_data(cache=False)
            if len(raw) > MAX_BODY_BYTES:
                return _error(413, f"the body is larger than {MAX_BODY_BYTES} bytes")
            try:
                body = json.loads(raw)
            except (ValueError, RecursionError):
                return _error(400, "the body is not JSON; send an AdmissionReview (admission.k8s.io/v1)")
            review = parse_review(body)
            uid = review.uid
            outcome = decide(review, policy)
            result = "allowed" if outcome.allowed else "denied"
            metrics.count_denials(endpoint, outcome.violations)
            return _json(build_response(uid, allowed=outcome.allowed, message=outcome.message,
                                        patch=outcome.patch, warnings=outcome.warnings))
        except BadReviewError as exc:
            return _error(exc.status, exc.message)
        except RecursionError:
            return _error(400, "the object is nested too deeply")
        finally:
            elapsed = time.perf_counter() - started
            metrics.REVIEWS.labels(endpoint, result).inc()
            metrics.LATENCY.labels(endpoint).observe(elapsed)
            log.info("review", extra={
                "endpoint": endpoint, "result": result, "uid": uid, "ms": round(elapsed * 1000, 3),
                "operation": review.operation if review else "", "namespace": review.namespace if review else "",
                "pod": review.name if review else "", "user": review.user.username if review else "",
            })

    @app.post("/mutate")
    def mutate() -> Response:
        return serve("mutate", admission.mutate)

    @app.post("/validate")
    def validate() -> Response:
        return serve("validate", admission.validate)

    @app.get("/healthz")
    def healthz() -> Response:
        return _json({"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        return _json({"status": "ready"})

    @app.get("/metrics")
    def prometheus() -> Response:
        return Response(metrics.render(), mimetype="text/plain; version=0.0.4")

    @app.errorhandler(413)
    def too_large(_: Exception) -> Response:
        return _error(413, f"the body is larger than {MAX_BODY_BYTES} bytes")

    @app.errorhandler(404)
    def not_found(_: Exception) -> Response:
        return _error(404, "not found: POST /mutate or /validate, GET /healthz, /readyz or /metrics")

    @app.errorhandler(405)
    def wrong_method(_: Exception) -> Response:
        return _error(405, "method not allowed: POST /mutate or /validate, GET /healthz, /readyz or /metrics")

    @app.errorhandler(500)
    def internal(_: Exception) -> Response:
        log.exception("unexpected error answering a review")
        return _error(500, "internal error; see the webhook log")

    return app
