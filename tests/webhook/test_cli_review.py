"""`gpufrac review` and `gpufrac certs` as a person runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from tests.webhook.builders import BINDER, INFERENCE, NOTEBOOK, pod

ROOT = Path(__file__).resolve().parents[2]


def gpufrac(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpufrac", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def write(path: Path, obj) -> str:
    path.write_text(yaml.safe_dump(obj))
    return str(path)


def test_review_prints_the_mutated_pod_and_exits_0(tmp_path):
    result = gpufrac("review", write(tmp_path / "pod.yaml", pod(INFERENCE)))
    assert result.returncode == 0, result.stdout + result.stderr
    out = json.loads(result.stdout)
    assert out["allowed"] is True and out["message"] == ""
    assert out["object"]["metadata"]["annotations"]["gpufrac.io/container.app.mps-pinned-mem-limit"] == \
        "0=61440M,1=61440M,2=61440M,3=61440M"
    assert any(op["path"] == "/metadata/labels" for op in out["patch"])


def test_review_exits_1_with_the_denial(tmp_path):
    result = gpufrac("review", write(tmp_path / "pod.yaml", pod({"gpu-fraction": "half"})))
    assert result.returncode == 1
    assert json.loads(result.stdout)["message"].startswith("annotation gpu-fraction: half must be")


def test_review_of_a_bind_update_as_the_scheduler(tmp_path):
    created = json.loads(gpufrac("review", write(tmp_path / "pod.yaml", pod(NOTEBOOK))).stdout)["object"]
    bound = json.loads(json.dumps(created))
    bound["metadata"]["annotations"].update({
        "nvidia.com/container.app.gpus.devices": "GPU-a1b2c3d4,GPU-e5f6a7b8",
        "nvidia.com/container.app.gpu-memory.request": "71885Mi",
        "nvidia.com/container.app.gpu-memory.limit": "115016Mi"})
    args = ("review", write(tmp_path / "bound.yaml", bound), "--old", write(tmp_path / "old.yaml", created))
    as_binder = gpufrac(*args, "--user", BINDER)
    assert as_binder.returncode == 0, as_binder.stdout
    assert json.loads(as_binder.stdout)["object"]["metadata"]["annotations"][
        "gpufrac.io/container.app.mps-pinned-mem-limit"] == "0=115016M,1=115016M"
    assert gpufrac(*args, "--user", "alice").returncode == 1


def test_review_refuses_what_is_not_a_pod(tmp_path):
    result = gpufrac("review", write(tmp_path / "x.yaml", {"kind": "Deployment"}))
    assert result.returncode == 2 and "single Pod" in result.stdout


def test_certs_writes_a_ca_and_a_serving_cert_with_the_names(tmp_path):
    result = gpufrac("certs", "--out", str(tmp_path), "--dns", "gpufrac-webhook.gpufrac-system.svc")
    assert result.returncode == 0, result.stderr
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == {"gpufrac-webhook.gpufrac-system.svc", "localhost"}
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert cert.issuer == ca.subject
    ca.public_key().verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))
    assert oct((tmp_path / "tls.key").stat().st_mode & 0o777) == "0o600"
