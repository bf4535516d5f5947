"""A do-nothing admission webhook: `allowed: true` with the request's uid, no patch.

Served by the same gunicorn setup as `gpufrac webhook` (webhook.server.WebhookServer: gthread, same workers,
threads, keep-alive and TLS context factory), so the difference to gpufrac is what gpufrac does per review.

python -m bench.noop_app --certs DIR --bind HOST:PORT --workers N --threads N
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from flask import Flask, Response, request


def create_app() -> Flask:
    app = Flask("noop")

    def answer() -> Response:
        review = json.loads(request.get_data(cache=False))
        uid = review["request"]["uid"]
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": {"uid": uid, "allowed": True}}
        return Response(json.dumps(body, separators=(",", ":")), mimetype="application/json")

    app.add_url_rule("/mutate", "mutate", answer, methods=["POST"])
    app.add_url_rule("/validate", "validate", answer, methods=["POST"])
    app.add_url_rule("/readyz", "readyz", lambda: Response('{"status":"ready"}', mimetype="application/json"))
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.noop_app")
    parser.add_argument("--certs", required=True)
    parser.add_argument("--bind", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args(argv)

    from gpufrac.webhook.policy import Policy
    from gpufrac.webhook.server import ServeOptions, WebhookServer

    class NoopServer(WebhookServer):
        def load(self) -> Any:
            return create_app()

    options = ServeOptions(Path(args.certs), args.bind, args.workers, args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-noop-metrics-") as metrics_dir:
        NoopServer(Policy(), options, Path(metrics_dir)).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
