"""Listen addresses follow the pod's IP family (gpufrac.core.bind), and both HTTP servers of the agent and the
webhook's metrics port really listen on IPv6 and dual-stack."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpufrac.core.bind import host_has_ipv6, resolve_bind, split_bind, wildcard_host
from gpufrac.probes.server import ProbeServer, registry_text
from gpufrac.webhook.serve.server import metrics_server

needs_ipv6 = pytest.mark.skipif(not host_has_ipv6(), reason="this host cannot listen on IPv6")


@pytest.mark.parametrize("bind, pod_ip, ipv6, expected", [
    (":8443", "10.1.2.3", True, "0.0.0.0:8443"),
    (":8443", "fd00:10::7", False, "[::]:8443"),  # the pod's IP decides, not the probe
    (":8443", None, True, "[::]:8443"),
    (":8443", None, False, "0.0.0.0:8443"),
    (":8443", "", False, "0.0.0.0:8443"),
    ("127.0.0.1:8443", "fd00::1", True, "127.0.0.1:8443"),  # an explicit host is kept
    ("[::1]:9475", "10.0.0.1", True, "[::1]:9475"),
])
def test_resolve_bind(bind, pod_ip, ipv6, expected):
    assert resolve_bind(bind, pod_ip, ipv6) == expected


def test_split_bind_and_wildcard():
    assert split_bind("[::1]:9475") == ("::1", "9475")
    assert split_bind(":9475") == ("", "9475")
    assert wildcard_host("192.168.0.1", True) == "0.0.0.0"
    assert wildcard_host("2001:db8::1", False) == "::"


def _get(host: str, port: int, path: str = "/metrics") -> tuple[int, str]:
    url_host = f"[{host}]" if ":" in host else host
    with urllib.request.urlopen(f"http://{url_host}:{port}{path}", timeout=5) as resp:
        return resp.status, resp.read().decode()


def _agent_server(bind: str) -> ProbeServer:
    ok = lambda: (True, "ok")  # noqa: E731
    server = ProbeServer(bind, registry_text(CollectorRegistry()), {"/healthz": ok, "/readyz": ok})
    server.start()
    return server


@needs_ipv6
def test_agent_server_on_the_ipv6_wildcard_takes_both_families(monkeypatch):
    monkeypatch.setenv("POD_IP", "fd00::5")
    server = _agent_server(":0")
    try:
        assert server.server.address_family == socket.AF_INET6
        assert _get("::1", server.port, "/healthz") == (200, "ok\n")
        assert _get("127.0.0.1", server.port, "/healthz") == (200, "ok\n")  # dual-stack
    finally:
        server.stop()


def test_agent_server_on_an_ipv4_pod_listens_on_ipv4(monkeypatch):
    monkeypatch.setenv("POD_IP", "10.0.0.5")
    server = _agent_server(":0")
    try:
        assert server.server.address_family == socket.AF_INET
        assert server.server.server_address[0] == "0.0.0.0"
        assert _get("127.0.0.1", server.port, "/healthz")[0] == 200
    finally:
        server.stop()


@needs_ipv6
def test_webhook_metrics_listener_on_ipv6(tmp_path: Path):
    listener = metrics_server(resolve_bind(":0", "fd00::9", True), tmp_path).start()
    try:
        code, text = _get("::1", listener.port)
        assert code == 200 and "gpufrac_build_info" in text
        assert _get("127.0.0.1", listener.port)[0] == 200
        assert _get("::1", listener.port, "/healthz") == (200, "ok\n")
    finally:
        listener.stop()


@needs_ipv6
def test_webhook_without_a_bind_host_serves_both_families_on_an_ipv6_pod(tmp_path: Path):
    """The chart passes `--bind :8443`: on an IPv6 (or dual-stack) pod gunicorn listens on `::`, which takes
    IPv4 too; the API server may come over either."""
    import http.client
    import os
    import signal
    import ssl
    import subprocess
    import sys
    import time

    from gpufrac.certs.generate import issue_ca, issue_serving_cert, write_serving_files

    ca = issue_ca("bind-test-ca")
    write_serving_files(tmp_path, ca, issue_serving_cert(ca))
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "webhook.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "gpufrac", "webhook", "--certs", str(tmp_path), "--bind",
                             f":{port}", "--workers", "1", "--threads", "2"],
                            env={**os.environ, "POD_IP": "fd00:10::7"}, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    context.check_hostname = False  # the serving certificate names localhost and 127.0.0.1, not ::1

    def readyz(host: str) -> int:
        conn = http.client.HTTPSConnection(host, port, context=context, timeout=5)
        try:
            conn.request("GET", "/readyz")
            return conn.getresponse().status
        finally:
            conn.close()

    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                assert readyz("::1") == 200
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "webhook.log").read_text()
                time.sleep(0.2)
        assert readyz("127.0.0.1") == 200
        assert f"http://[::]:{port}" in (tmp_path / "webhook.log").read_text()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()
