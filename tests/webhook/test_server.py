"""The webhook as it runs: a real gunicorn process over HTTPS with the generated CA."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import ssl
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.toolkit.webhook import WebhookProcess
from gpufrac.certs.generate import issue_ca, issue_serving_cert, write_dev_certs, write_serving_files
from testkit.pods import INFERENCE, pod
from testkit.reviews import review_body

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("webhook")
    write_dev_certs(base / "certs")
    srv = WebhookProcess(base / "certs", base / "webhook.log")
    yield srv
    srv.stop()


def post(server, path, body) -> tuple[int, dict]:
    status, data = server.request("POST", path, json.dumps(body).encode())
    return status, json.loads(data)


def test_mutate_answers_with_a_base64_json_patch_and_echoes_the_uid(server):
    status, body = post(server, "/mutate", review_body(pod(INFERENCE), uid="uid-123"))
    assert status == 200
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    response = body["response"]
    assert response["uid"] == "uid-123" and response["allowed"] is True and response["patchType"] == "JSONPatch"
    import base64
    patch = json.loads(base64.b64decode(response["patch"]))
    assert {"op": "add", "path": "/metadata/labels", "value": {"gpufrac.io/fractional": "true"}} in patch


def test_validate_denies_with_a_forbidden_status_and_never_patches(server):
    status, body = post(server, "/validate", review_body(pod({"gpu-fraction": "1.5"})))
    assert status == 200
    response = body["response"]
    assert response["allowed"] is False and "patch" not in response
    assert response["status"]["code"] == 403
    assert response["status"]["message"].startswith("annotation gpu-fraction: 1.5 must be a decimal number")


@pytest.mark.parametrize(("body", "status", "fragment"), [
    (b"not json", 400, "not JSON"),
    (b"[]", 400, "must be a JSON object"),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', 400, "no request object"),
    (b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}}', 400,
     "expected apiVersion admission.k8s.io/v1"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                 "request": {"uid": "u", "operation": "CREATE", "resource": {"resource": "pods"},
                             "object": {"metadata": {"annotations": []}}}}).encode(),
     400, "annotations must be an object"),
    (b"[" * 100000, 400, ""),
])
def test_malformed_reviews_get_a_json_400(server, body, status, fragment):
    got, data = server.request("POST", "/mutate", body)
    assert got == status
    assert fragment in json.loads(data)["error"]


def test_oversized_bodies_get_a_413_before_they_are_read(server):
    with socket.create_connection(("127.0.0.1", server.port)) as raw, \
            server.context().wrap_socket(raw, server_hostname="localhost") as tls:
        tls.sendall(b"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 9437184\r\n\r\n" + b"x" * 65536)
        reply = b""
        while b"}" not in reply:
            chunk = tls.recv(65536)
            if not chunk:
                break
            reply += chunk
        reply = reply.decode()
    assert reply.startswith("HTTP/1.1 413") and "larger than" in reply


OVER_LIMIT = 9 * 1024 * 1024  # the limit is 8 MiB


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_client_that_sends_a_body_over_the_limit_before_reading_reads_the_413(server, chunked):
    """Python's requests sends the whole body before it reads (no `Expect: 100-continue`): the server answers
    413 without reading the body, then drains it, so the client reads the answer instead of a reset."""
    import requests

    body = b"x" * OVER_LIMIT
    data = iter([body[i:i + 1 << 20] for i in range(0, len(body), 1 << 20)]) if chunked else body
    response = requests.post(f"https://localhost:{server.port}/validate", data=data, timeout=30,
                             headers={"Content-Type": "application/json"}, verify=str(server.certs / "ca.crt"))
    assert response.status_code == 413
    assert response.json() == {"error": "the body is larger than 8388608 bytes", "code": 413}
    assert response.headers["Connection"] == "close"
    assert server.request("GET", "/readyz")[0] == 200


def test_a_refused_body_still_being_sent_holds_up_no_other_client(tmp_path):
    """One worker: the client whose body is refused is still sending it while another client is answered on
    the same worker, and then reads its 413."""
    write_dev_certs(tmp_path / "certs")
    srv = WebhookProcess(tmp_path / "certs", tmp_path / "webhook.log", workers=1, threads=2)
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as raw, \
                srv.context().wrap_socket(raw, server_hostname="localhost") as big:
            big.sendall(b"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n" % OVER_LIMIT + b"x" * (1 << 20))
            # Meanwhile, mid-body: another client's review is answered.
            status, data = srv.request("POST", "/mutate", json.dumps(review_body(pod(INFERENCE))).encode())
            assert status == 200 and json.loads(data)["response"]["allowed"] is True
            big.sendall(b"x" * (OVER_LIMIT - (1 << 20)))  # the rest is still taken, not reset
            reply = b""
            while b"}" not in reply:
                chunk = big.recv(65536)
                if not chunk:
                    break
                reply += chunk
        head, _, answer = reply.decode().partition("\r\n\r\n")
        assert head.startswith("HTTP/1.1 413") and "Connection: close" in head
        assert json.loads(answer)["code"] == 413
        assert srv.popen.poll() is None
    finally:
        srv.stop()


def test_connections_that_send_nothing_hold_up_no_review(server):
    """As many connections as the server has threads (2 workers x 4), open and silent: gunicorn's gthread would give
    each a thread for 5 s; the listener's TCP_DEFER_ACCEPT keeps them in the kernel, so reviews on new connections
    are answered at once (without it, one review waited 4.6 s behind 8 of them, and 9.8 s in another run)."""
    silent = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(2 * 4)]
    try:
        time.sleep(0.3)
        for _ in range(5):
            started = time.monotonic()
            status, _ = server.request("POST", "/validate", json.dumps(review_body(pod(INFERENCE))).encode())
            assert status == 200 and time.monotonic() - started < 1.5
    finally:
        for sock in silent:
            sock.close()


def test_wrong_methods_and_paths_get_json_errors(server):
    assert server.request("GET", "/mutate")[0] == 405
    status, data = server.request("GET", "/nope")
    assert status == 404 and "POST /mutate" in json.loads(data)["error"]


def test_keep_alive_serves_many_reviews_on_one_connection(server):
    conn = server.connection()
    try:
        for _ in range(5):
            status, _ = server.request("POST", "/mutate", json.dumps(review_body(pod(INFERENCE))).encode(), conn)
            assert status == 200
    finally:
        conn.close()


def test_tls_below_1_2_is_refused(server):
    context = server.context()
    context.minimum_version = ssl.TLSVersion.TLSv1_1
    context.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises(ssl.SSLError), socket.create_connection(("127.0.0.1", server.port)) as raw:
        context.wrap_socket(raw, server_hostname="localhost")


def test_metrics_count_reviews_across_workers(server):
    def count(text: str, webhook: str, result: str) -> float:
        return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == "gpufrac_admission_reviews_total"
                   and s.labels == {"webhook": webhook, "result": result})

    before = server.request("GET", "/metrics")[1].decode()
    for _ in range(20):  # new connections, so both workers answer some
        post(server, "/validate", review_body(pod({"gpu-fraction": "2"})))
    after = server.request("GET", "/metrics")[1].decode()
    assert count(after, "validate", "denied") - count(before, "validate", "denied") == 20
    assert "gpufrac_admission_review_duration_seconds_bucket" in after


def test_one_json_log_line_per_review(server):
    post(server, "/mutate", review_body(pod({"gpu-fraction": "0.5"}), uid="log-me"))
    time.sleep(0.2)
    lines = [json.loads(line) for line in server.log_path.read_text().splitlines() if '"log-me"' in line]
    assert len(lines) == 1 and lines[0]["endpoint"] == "mutate" and lines[0]["result"] == "allowed"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", lines[0]["time"])
    assert lines[0]["reason"] == ""


def test_the_review_line_of_a_denial_says_why(server):
    post(server, "/validate", review_body(pod({"gpu-fraction": "1.5"}), uid="deny-me"))
    time.sleep(0.2)
    [line] = [json.loads(text) for text in server.log_path.read_text().splitlines() if '"deny-me"' in text]
    assert (line["level"], line["result"], line["message"]) == ("info", "denied", "review")
    assert "annotation gpu-fraction" in line["reason"] and "1.5" in line["reason"]


def test_a_rotated_certificate_is_served_to_new_connections_without_restart(tmp_path):
    certs = tmp_path / "certs"
    write_dev_certs(certs)
    srv = WebhookProcess(certs, tmp_path / "webhook.log")
    try:
        old_ca = tmp_path / "old-ca.crt"
        old_ca.write_bytes((certs / "ca.crt").read_bytes())
        kept = srv.connection(old_ca)
        assert srv.request("GET", "/healthz", conn=kept)[0] == 200

        new_ca = issue_ca("rotated-ca")
        write_serving_files(certs, new_ca, issue_serving_cert(new_ca))
        assert srv.request("GET", "/healthz", conn=srv.connection(certs / "ca.crt"))[0] == 200
        with pytest.raises(ssl.SSLCertVerificationError):
            srv.request("GET", "/healthz", conn=srv.connection(old_ca))
        assert srv.request("GET", "/healthz", conn=kept)[0] == 200  # an open connection keeps working
        kept.close()
        assert srv.popen.poll() is None
    finally:
        srv.stop()


def test_sigterm_stops_the_server_cleanly(tmp_path):
    write_dev_certs(tmp_path / "certs")
    srv = WebhookProcess(tmp_path / "certs", tmp_path / "webhook.log")
    os.killpg(srv.popen.pid, signal.SIGTERM)
    assert srv.popen.wait(timeout=30) == 0
    srv.stop()


def test_a_metrics_directory_it_is_given_keeps_everything_but_the_servers_own_files(tmp_path):
    """$PROMETHEUS_MULTIPROC_DIR is the operator's: an earlier run's series files go, anything else stays, and
    the directory is still there after the server stops."""
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    (metrics_dir / "notes.txt").write_text("keep me")
    (metrics_dir / "counter_99999.db").write_bytes(b"stale")
    write_dev_certs(tmp_path / "certs")
    srv = WebhookProcess(tmp_path / "certs", tmp_path / "webhook.log", metrics_dir=metrics_dir)
    try:
        assert not (metrics_dir / "counter_99999.db").exists()
        assert srv.request("POST", "/validate", json.dumps(review_body(pod(INFERENCE))).encode())[0] == 200
        assert list(metrics_dir.glob("*.db"))  # the workers' own series files
    finally:
        os.killpg(srv.popen.pid, signal.SIGTERM)
        assert srv.popen.wait(timeout=30) == 0
        srv.stop()
    assert sorted(p.name for p in metrics_dir.iterdir()) == ["notes.txt"]
    assert (metrics_dir / "notes.txt").read_text() == "keep me"


def test_large_reviews_take_turns_across_processes(tmp_path, monkeypatch):
    """Two gates on one lock file stand for two workers: while one decodes a large review, the other waits, and
    past the wait it answers 503 rather than holding a thread for ever."""
    from gpufrac.webhook.serve import app

    monkeypatch.setattr(app, "LARGE_REVIEW_WAIT_SECONDS", 0.2)
    first, second = app.LargeReviewGate(tmp_path / "lock"), app.LargeReviewGate(tmp_path / "lock")
    with first.turn():
        with pytest.raises(app._RefusedError) as refused, second.turn():
            pass
        assert refused.value.status == 503
    with second.turn():  # free again once the first is done
        pass


def test_large_reviews_sent_together_are_all_answered(server):
    """Reviews over the large-review size from several clients at once: each waits its turn and is answered."""
    import concurrent.futures

    from gpufrac.webhook.serve.app import LARGE_REVIEW_BYTES

    big = pod(INFERENCE)
    big["metadata"]["annotations"]["note.example.com/pad"] = "x" * (LARGE_REVIEW_BYTES + 1000)
    body = json.dumps(review_body(big)).encode()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: server.request("POST", "/mutate", body), range(4)))
    assert [status for status, _ in answers] == [200] * 4
    assert all(json.loads(data)["response"]["allowed"] is True for _, data in answers)


def test_an_address_it_cannot_listen_on_is_one_clear_line(tmp_path):
    import subprocess
    import sys

    write_dev_certs(tmp_path / "certs")
    result = subprocess.run([sys.executable, "-m", "gpufrac", "webhook", "--certs", str(tmp_path / "certs"),
                             "--bind", "192.0.2.1:8443"],  # TEST-NET-1: no host has it
                            cwd=ROOT, capture_output=True, text=True, timeout=60, env={**os.environ,
                            "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"), "XDG_RUNTIME_DIR": str(tmp_path)})
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == \
        "gpufrac webhook: cannot listen on 192.0.2.1:8443: Cannot assign requested address"
    assert "Traceback" not in result.stderr
