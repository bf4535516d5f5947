"""Prometheus metrics of the webhook, correct across gunicorn worker processes (multiprocess mode).

`PROMETHEUS_MULTIPROC_DIR` must be set before prometheus_client is imported; `server.py` does that.
Names join with what clusters already scrape: no `_created` series, ratios as `_ratio`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from cryptography import x509
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from gpufrac.core import annotations as ann
from gpufrac.core.buildinfo import build_info
from gpufrac.core.contract import FRACTIONAL_LABEL
from gpufrac.webhook.decide.errors import Violation

disable_created_metrics()  # type: ignore[no-untyped-call]

# `webhook` (mutate, validate), not `endpoint`: behind the Prometheus Operator every target carries an `endpoint`
# label (the ServiceMonitor's port), which would overwrite ours.
REVIEWS = Counter("gpufrac_admission_reviews_total", "AdmissionReviews answered, by webhook and result",
                  ["webhook", "result"])
# Up to 30 s, the longest webhook timeout the API server allows: a p99 past the alert's threshold (1 s) and the
# configured timeouts is measurable, not lost in +Inf.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 15.0,
                   30.0)
LATENCY = Histogram("gpufrac_admission_review_duration_seconds", "Time to answer one AdmissionReview",
                    ["webhook"], buckets=LATENCY_BUCKETS)
DENIALS = Counter("gpufrac_admission_denials_total",
                  "Broken rules in denied AdmissionReviews, by webhook and reason (what the denial names)",
                  ["webhook", "reason"])

# The certificates `gpufrac webhook --certs DIR` serves with and trusts, by the label they get.
CERTIFICATE_FILES = {"serving": "tls.crt", "ca": "ca.crt"}


def denial_reason(violation: Violation) -> str:
    """A bounded label for what a denial is about: the annotation key with the container name taken out
    (`nvidia.com/container.*.gpu-memory.limit`), or the kind of object it names (`container`, `volume`, `label
    gpufrac.io/fractional`, `pod`). Keys outside the contract are `annotation`, so no user can grow the series."""
    kind, _, name = violation.subject.partition(" ")
    if kind == "annotation":
        if name in ann.SHORTHAND_KEYS:
            return f"annotation {name}"
        try:
            key = ann.parse_container_key(name)
        except ann.MalformedKeyError:
            return "annotation malformed-key"
        return f"annotation {key.prefix}*.{key.suffix}" if key else "annotation"
    if kind == "label" and name == FRACTIONAL_LABEL:
        return violation.subject
    if kind == "ephemeral":
        return "container"
    return kind if kind in ("container", "volume", "pod", "label") else "other"


# Each label combination's series, looked up once (`labels()` checks and locks on every call). Made on first use,
# in the worker that counts: in multiprocess mode a series is a file of that process.
_SERIES: dict[tuple[str, str], tuple[Any, Any]] = {}


def observe(endpoint: str, result: str, seconds: float) -> None:
    """One review answered."""
    series = _SERIES.get((endpoint, result))
    if series is None:
        series = _SERIES.setdefault((endpoint, result), (REVIEWS.labels(endpoint, result), LATENCY.labels(endpoint)))
    series[0].inc()
    series[1].observe(seconds)


def count_denials(endpoint: str, violations: Iterable[Violation]) -> None:
    for violation in violations:
        DENIALS.labels(endpoint, denial_reason(violation)).inc()


class BuildInfoCollector(Collector):
    def collect(self) -> Iterator[InfoMetricFamily]:
        yield InfoMetricFamily("gpufrac_build", "The running gpufrac: version and Python",
                               value={**build_info(), "component": "webhook"})


class CertificateCollector(Collector):
    """When each certificate the webhook has mounted expires, read at every scrape (the kubelet swaps rotated
    files in, so this follows the rotation job and cert-manager). A file that cannot be read has no series."""

    def __init__(self, certs_dir: Path) -> None:
        self.certs_dir = certs_dir

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("gpufrac_certificate_expiration_timestamp_seconds",
                                   "When the webhook's certificate expires (notAfter, Unix time); ca is the "
                                   "earliest-expiring certificate of ca.crt", labels=["certificate"])
        for label, filename in CERTIFICATE_FILES.items():
            not_after = earliest_expiry(self.certs_dir / filename)
            if not_after is not None:
                family.add_metric([label], not_after.timestamp())
        yield family


def earliest_expiry(path: Path) -> dt.datetime | None:
    try:
        certs = x509.load_pem_x509_certificates(path.read_bytes())
    except (OSError, ValueError):
        return None
    return min(c.not_valid_after_utc for c in certs) if certs else None


def render(extra: Iterable[Collector] = ()) -> bytes:
    """All workers' metrics, aggregated, in the text format, with `extra` collectors of this process."""
    registry = CollectorRegistry()
    try:
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    except ValueError:  # not under gunicorn (tests, `gpufrac review`): this process's own values
        registry = REGISTRY
    collectors = [BuildInfoCollector(), *extra]
    for collector in collectors:
        registry.register(collector)
    try:
        return generate_latest(registry)
    finally:
        if registry is REGISTRY:
            for collector in collectors:
                registry.unregister(collector)
