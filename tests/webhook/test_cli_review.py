"""`gpufrac review` and `gpufrac certs` as a person runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from testkit.admission import BINDER
from testkit.pods import INFERENCE, NOTEBOOK, pod, workload

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


def test_review_refuses_a_kind_it_does_not_review_in_one_line(tmp_path):
    result = gpufrac("review", write(tmp_path / "x.yaml", {"kind": "Service", "metadata": {"name": "s"}}))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"gpufrac review: {tmp_path / 'x.yaml'}, document 1: kind Service is not one gpufrac " \
                            "reviews; it reviews Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob, " \
                            "PodTemplate\n"


WORKLOAD_KINDS = ["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "PodTemplate"]



def test_review_judges_every_document_of_every_kind(tmp_path):
    docs = [workload(kind, {"gpu-fraction": "0.5"}) for kind in WORKLOAD_KINDS] + [pod(INFERENCE)]
    path = tmp_path / "all.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    result = gpufrac("review", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    out = json.loads(result.stdout)
    assert [r["kind"] for r in out] == [*WORKLOAD_KINDS, "Pod"] and all(r["allowed"] for r in out)
    assert [r["document"] for r in out] == list(range(1, 9))
    assert all(r["patch"] == [] for r in out[:-1]) and out[-1]["patch"]  # templates are never mutated


def test_review_exits_1_when_one_document_is_denied_and_says_where(tmp_path):
    docs = [workload("Deployment", {"gpu-fraction": "0.5"}), workload("CronJob", {"gpu-fraction": "1.5"})]
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    result = gpufrac("review", str(path))
    assert result.returncode == 1
    first, second = json.loads(result.stdout)
    assert first["allowed"] and not second["allowed"]
    assert second["message"].startswith("spec.jobTemplate.spec.template: annotation gpu-fraction: 1.5 must be")


def test_review_reads_standard_input_and_lists():
    listing = {"apiVersion": "v1", "kind": "List", "items": [pod({"gpu-fraction": "0.5"}), pod({"gpu-memory": "x"})]}
    result = subprocess.run([sys.executable, "-m", "gpufrac", "review", "-"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, input=json.dumps(listing))
    assert result.returncode == 1
    assert [r["allowed"] for r in json.loads(result.stdout)] == [True, False]
    assert [r["file"] for r in json.loads(result.stdout)] == ["-", "-"]


@pytest.mark.parametrize(("content", "problem"), [
    (None, "cannot be read: No such file or directory"),
    ("kind: Pod\nmetadata: [\n", "is not YAML at line 3, column 1"),
    ("", "holds no manifest"),
    ("---\n---\n", "holds no manifest"),
    ("- 1\n- 2\n", "document 1: the manifest must be an object of kind Pod, Deployment"),
    ("kind: Pod\nmetadata: {annotations: {gpu-fraction: 0.5}}\nspec: {containers: [{name: a}]}\n",
     "document 1: object.metadata.annotations['gpu-fraction'] must be a string"),
    ("kind: Deployment\nspec: {template: 5}\n", "document 1: object.spec.template must be an object"),
    (b"\xff\xfe\x00", "cannot be read"),
])
def test_unreadable_input_is_one_line_and_exit_2(tmp_path, content, problem):
    path = tmp_path / "in.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    result = gpufrac("review", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"gpufrac review: {path}") and problem in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr and result.stdout == ""


def test_old_compares_one_manifest_with_one(tmp_path):
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump_all([pod(INFERENCE), pod(INFERENCE)]))
    result = gpufrac("review", str(two), "--old", write(tmp_path / "old.yaml", pod(INFERENCE)))
    assert result.returncode == 2 and "--old compares one manifest with one" in result.stderr


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
