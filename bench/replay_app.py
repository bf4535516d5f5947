"""A webhook that answers each review with the answer gpufrac gave the first review of the same shape (the same
annotations and containers), the uid swapped in: gpufrac's patches and verdicts without gpufrac's work per review.
Set against the do-nothing webhook through the API server, it shows what applying gpufrac's patches and storing
the bigger pod costs the API server; set against gpufrac, what gpufrac's own work per review costs a user.

Served by the same gunicorn setup as `gpufrac webhook` (webhook.server.WebhookServer), like bench.noop_app.

python -m bench.replay_app --certs DIR --bind HOST:PORT --workers N --threads N
"""

from __future__ import annotations

import json
from typing import Any

from flask import Flask, Response, request

from bench.noop_app import review_routes, serve
from gpufrac.webhook.decide import admission
from gpufrac.webhook.decide.policy import Policy
from gpufrac.webhook.decide.review import build_response, parse_review


def create_app(policy: Policy) -> Flask:
    answers: dict[tuple[str, str], dict[str, Any]] = {}

    def answer() -> Response:
        review = json.loads(request.get_data(cache=False))
        obj = review["request"]["object"]
        shape = json.dumps([obj["metadata"].get("annotations"),
                            [c.get("name") for c in obj["spec"].get("containers", [])]], sort_keys=True)
        key = (request.path, shape)
        if key not in answers:
            decide = admission.mutate if request.path == "/mutate" else admission.validate
            outcome = decide(parse_review(review), policy)
            answers[key] = build_response("", allowed=outcome.allowed, message=outcome.message,
                                          patch=outcome.patch, warnings=outcome.warnings)
        body = {**answers[key], "response": {**answers[key]["response"], "uid": review["request"]["uid"]}}
        return Response(json.dumps(body, separators=(",", ":")), mimetype="application/json")

    return review_routes(Flask("replay"), answer)


if __name__ == "__main__":
    raise SystemExit(serve("python -m bench.replay_app", create_app))
