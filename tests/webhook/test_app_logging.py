"""Every line the webhook logs while it answers a review carries that review's admission uid."""

from __future__ import annotations

import io
import json
import logging

import pytest

from gpufrac.core.jsonlog import JsonFormatter
from gpufrac.webhook.decide import admission
from gpufrac.webhook.decide.policy import Policy
from gpufrac.webhook.serve.app import create_app
from testkit.pods import pod
from testkit.reviews import review_body


@pytest.fixture
def log_lines():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    # the webhook's logger only: threads other tests left running (the agent's) may still log under "gpufrac"
    logger = logging.getLogger("gpufrac.webhook")
    logger.addHandler(handler)
    level = logger.level
    # setLevel, not `logger.level =`: it clears isEnabledFor's cache, which an earlier test may have filled
    logger.setLevel(logging.INFO)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_lines_logged_inside_a_review_carry_its_uid(monkeypatch: pytest.MonkeyPatch, log_lines) -> None:
    decide = admission.mutate

    def noisy(request, policy):
        logging.getLogger("gpufrac.webhook.test").warning("deciding")
        return decide(request, policy)

    monkeypatch.setattr(admission, "mutate", noisy)
    client = create_app(Policy()).test_client()
    assert client.post("/mutate", json=review_body(pod({"gpu-fraction": "0.5"}), uid="uid-42")).status_code == 200
    lines = log_lines()
    assert [(line["message"], line.get("uid")) for line in lines] == [("deciding", "uid-42"), ("review", "uid-42")]


def test_an_unexpected_error_is_logged_with_the_uid_and_answered_500(monkeypatch: pytest.MonkeyPatch,
                                                                     log_lines) -> None:
    def broken(request, policy):
        raise RuntimeError("bug")

    monkeypatch.setattr(admission, "validate", broken)
    client = create_app(Policy()).test_client()
    response = client.post("/validate", json=review_body(pod({"gpu-fraction": "0.5"}), uid="uid-43"))
    assert response.status_code == 500 and response.get_json()["error"].startswith("internal error")
    [error, review] = log_lines()
    assert (error["level"], error["uid"]) == ("error", "uid-43") and "RuntimeError: bug" in error["exception"]
    assert (review["result"], review["uid"]) == ("error", "uid-43")
