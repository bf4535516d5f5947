"""Prometheus metrics of the webhook, correct across gunicorn worker processes (multiprocess mode).

`PROMETHEUS_MULTIPROC_DIR` must be set before prometheus_client is imported; `server.py` does that.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, multiprocess

REVIEWS = Counter("gpufrac_admission_reviews_total", "AdmissionReviews answered, by endpoint and result",
                  ["endpoint", "result"])
LATENCY = Histogram("gpufrac_admission_review_duration_seconds", "Time to answer one AdmissionReview",
                    ["endpoint"], buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))


def render() -> bytes:
    """All workers' metrics, aggregated, in the text format."""
    registry = CollectorRegistry()
    try:
        multiprocess.MultiProcessCollector(registry)
    except ValueError:  # not under gunicorn (tests, `gpufrac review`): this process's own values
        from prometheus_client import REGISTRY
        return generate_latest(REGISTRY)
    return generate_latest(registry)
