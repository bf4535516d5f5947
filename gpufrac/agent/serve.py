"""HTTP endpoints: /metrics (Prometheus text), /healthz (loop alive), /readyz (agent doing its job)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gpufrac.agent.errors import ConfigError
from gpufrac.core.bind import host_has_ipv6, wildcard_host

# (ok, text)
Probe = Callable[[], tuple[bool, str]]


def parse_bind(bind: str, pod_ip: str | None = None) -> tuple[str, int]:
    """HOST:PORT; an empty host (`:9475`) is the any-address of the pod's family (POD_IP, else the host's)."""
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--metrics-bind {bind}: expected HOST:PORT, e.g. :9475 or 0.0.0.0:9475")
    return host.strip("[]") or wildcard_host(pod_ip, host_has_ipv6()), int(port)


class _DualStackHTTPServer(ThreadingHTTPServer):
    """An IPv6 listener; on `::` it takes IPv4 too (IPV6_V6ONLY off)."""

    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        if self.server_address[0] == "::":
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


class AgentHttpServer:
    def __init__(self, bind: str, registry: CollectorRegistry, healthz: Probe, readyz: Probe) -> None:
        host, port = parse_bind(bind, os.environ.get("POD_IP"))

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif path in ("/healthz", "/readyz"):
                    ok, text = (healthz if path == "/healthz" else readyz)()
                    self._send(200 if ok else 503, (text + "\n").encode(), "text/plain; charset=utf-8")
                else:
                    self._send(404, b"not found\n", "text/plain; charset=utf-8")

            def _send(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        try:
            server_class = _DualStackHTTPServer if ":" in host else ThreadingHTTPServer
            self.server = server_class((host, port), Handler)
        except OSError as err:
            raise ConfigError(f"--metrics-bind {bind}: {err.strerror or err}") from err
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="metrics-http", daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
