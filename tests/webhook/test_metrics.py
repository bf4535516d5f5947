"""The webhook's metrics: bounded denial reasons, certificate expiry read from the mounted files, build info."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufrac.certs.generate import issue_ca, issue_serving_cert, write_serving_files
from gpufrac.webhook.decide import admission
from gpufrac.webhook.decide.errors import Violation, annotation
from gpufrac.webhook.decide.policy import Policy
from gpufrac.webhook.decide.review import parse_review
from gpufrac.webhook.serve.metrics import BuildInfoCollector, CertificateCollector, denial_reason
from testkit.pods import pod
from testkit.reviews import review_body


@pytest.mark.parametrize("violation, reason", [
    (annotation("gpu-fraction", "1.5", "must be ..."), "annotation gpu-fraction"),
    (annotation("nvidia.com/container.app.gpu-memory.limit", "1Gi", "must be ..."),
     "annotation nvidia.com/container.*.gpu-memory.limit"),
    (annotation("nvidia.com/container.other-name.gpu-memory.limit", "1Gi", "must be ..."),
     "annotation nvidia.com/container.*.gpu-memory.limit"),  # the container's name is not part of the label
    (annotation("kai.scheduler/container.app.gpu-memory.portion.limit", "2", "..."),
     "annotation kai.scheduler/container.*.gpu-memory.portion.limit"),
    (annotation("nvidia.com/container.app.made-up", "x", "..."), "annotation malformed-key"),
    (annotation("example.com/anything-a-user-types", "x", "..."), "annotation"),
    (Violation("label gpufrac.io/fractional", "is set by gpufrac"), "label gpufrac.io/fractional"),
    (Violation("container app", "is privileged"), "container"),
    (Violation("ephemeral container debugger", "sets NVIDIA_VISIBLE_DEVICES"), "container"),
    (Violation("volume mps", "mounts /run/gpufrac/mps"), "volume"),
    (Violation("pod", "mixes compute modes"), "pod"),
])
def test_denial_reason_is_bounded(violation, reason):
    assert denial_reason(violation) == reason


def test_a_real_denial_has_the_reason_of_its_annotation():
    review = parse_review(review_body(pod({"gpu-fraction": "1.5"}), operation="CREATE"))
    outcome = admission.mutate(review, Policy())
    assert not outcome.allowed
    assert [denial_reason(v) for v in outcome.violations] == ["annotation gpu-fraction"]


def _samples(collector) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples}


def test_certificate_expiry_is_read_from_the_mounted_files(tmp_path: Path):
    ca = issue_ca("metrics-ca", days=100)
    serving = issue_serving_cert(ca, days=20)
    write_serving_files(tmp_path, ca, serving)
    values = _samples(CertificateCollector(tmp_path))
    serving_at = values[("gpufrac_certificate_expiration_timestamp_seconds", (("certificate", "serving"),))]
    ca_at = values[("gpufrac_certificate_expiration_timestamp_seconds", (("certificate", "ca"),))]
    now = dt.datetime.now(dt.UTC).timestamp()
    assert serving_at - now == pytest.approx(20 * 86400, abs=120)
    assert ca_at - now == pytest.approx(100 * 86400, abs=120)
    # A rotation is seen at the next scrape.
    write_serving_files(tmp_path, ca, issue_serving_cert(ca, days=60))
    later = _samples(CertificateCollector(tmp_path))
    assert later[("gpufrac_certificate_expiration_timestamp_seconds", (("certificate", "serving"),))] - now \
        == pytest.approx(60 * 86400, abs=120)


def test_unreadable_certificates_have_no_series(tmp_path: Path):
    (tmp_path / "tls.crt").write_text("not a certificate")
    assert _samples(CertificateCollector(tmp_path)) == {}


def test_build_info():
    ((name, labels), value), = _samples(BuildInfoCollector()).items()
    assert name == "gpufrac_build_info" and value == 1
    assert dict(labels)["component"] == "webhook" and dict(labels)["version"]
