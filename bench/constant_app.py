"""A webhook that answers each pod CREATE with a constant JSON patch, picked by the pod's annotations: gpufrac's
additions to a seed pod written by a webhook that does nothing else (issue 47's fraction floors,
bench/fraction_floor.py). It decides nothing and builds nothing per review: what the API server then spends is what
any webhook writing those additions costs it.

Served by the same gunicorn setup as `gpufrac webhook` (webhook.server.WebhookServer), like bench.noop_app. The
answers file maps a variant (the URL path `/mutate/<variant>`) to its shapes: `{variant: [{"annotations": {...},
"patch": [...]}, ...]}`; a pod no shape matches is allowed unchanged.

python -m bench.constant_app --answers FILE --certs DIR --bind HOST:PORT --workers N --threads N
"""

from __future__ import annotations

import argparse
import base64
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flask import Flask, Response, abort, request

from bench.noop_app import serve

Answers = Mapping[str, list[tuple[dict[str, str], str]]]  # variant -> [(annotations, the patch in base64)]


def load_answers(text: str) -> dict[str, list[tuple[dict[str, str], str]]]:
    """The answers file's variants, each patch encoded once, as the review's answer carries it."""
    return {variant: [(dict(s["annotations"]), base64.b64encode(json.dumps(s["patch"]).encode()).decode())
                      for s in shapes]
            for variant, shapes in json.loads(text).items()}


def patch_for(shapes: list[tuple[dict[str, str], str]], annotations: Mapping[str, str]) -> str | None:
    """The patch of the first shape whose annotations the pod carries, all with the same values."""
    for wanted, patch in shapes:
        if all(annotations.get(key) == value for key, value in wanted.items()):
            return patch
    return None


def create_app(answers: Answers) -> Flask:
    app = Flask("constant")

    def mutate(variant: str) -> Response:
        if variant not in answers:
            abort(404)
        review = json.loads(request.get_data(cache=False))
        annotations = review["request"]["object"]["metadata"].get("annotations") or {}
        answer: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": True}
        patch = patch_for(answers[variant], annotations)
        if patch is not None:
            answer.update(patchType="JSONPatch", patch=patch)
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": answer}
        return Response(json.dumps(body, separators=(",", ":")), mimetype="application/json")

    app.add_url_rule("/mutate/<variant>", "mutate", mutate, methods=["POST"])
    app.add_url_rule("/readyz", "readyz", lambda: Response('{"status":"ready"}', mimetype="application/json"))
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.constant_app", add_help=False)
    parser.add_argument("--answers", required=True, type=Path)
    args, rest = parser.parse_known_args(argv)
    answers = load_answers(args.answers.read_text())
    return serve("python -m bench.constant_app", lambda _: create_app(answers), rest)


if __name__ == "__main__":
    raise SystemExit(main())
