"""A do-nothing admission webhook: `allowed: true` with the request's uid, no patch.

Served by the same gunicorn setup as `gpufrac webhook` (webhook.server.WebhookServer: gthread, same workers,
threads, keep-alive and TLS context factory), so the difference to gpufrac is what gpufrac does per review.

python -m bench.noop_app --certs DIR --bind HOST:PORT --workers N --threads N
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flask import Flask, Response, request

from gpufrac.webhook.decide.policy import Policy


def review_routes(app: Flask, answer: Callable[[], Response]) -> Flask:
    """POST /mutate and /validate answered by `answer`, GET /readyz: what the bench posts and probes."""
    app.add_url_rule("/mutate", "mutate", answer, methods=["POST"])
    app.add_url_rule("/validate", "validate", answer, methods=["POST"])
    app.add_url_rule("/readyz", "readyz", lambda: Response('{"status":"ready"}', mimetype="application/json"))
    return app


def create_app() -> Flask:
    def answer() -> Response:
        review = json.loads(request.get_data(cache=False))
        uid = review["request"]["uid"]
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": {"uid": uid, "allowed": True}}
        return Response(json.dumps(body, separators=(",", ":")), mimetype="application/json")

    return review_routes(Flask("noop"), answer)


def serve(prog: str, create: Callable[[Policy], Flask], argv: list[str] | None = None) -> int:
    """Serve the app `create` makes on `gpufrac webhook`'s gunicorn setup, from the command line
    (--certs DIR --bind HOST:PORT --workers N --threads N)."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--certs", required=True)
    parser.add_argument("--bind", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args(argv)

    from gpufrac.webhook.serve.server import ServeOptions, WebhookServer

    class StandInServer(WebhookServer):
        def load(self) -> Any:
            return create(self.policy)

    options = ServeOptions(Path(args.certs), args.bind, args.workers, args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-stand-in-metrics-") as metrics_dir:
        StandInServer(Policy(), options, Path(metrics_dir)).run()
    return 0


def main(argv: list[str] | None = None) -> int:
    return serve("python -m bench.noop_app", lambda _: create_app(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
