"""The one plain-HTTP metrics and probe server of both programs: GET /metrics (Prometheus text) and named probes
(/healthz, /readyz), 200 or 503 with a line of text. The agent serves its loop's probes on it (`--metrics-bind`);
the webhook's gunicorn master serves every worker's metrics on it, so Prometheus scrapes without the chart's CA.

A bind without a host (`:9475`) listens on every address of the pod's family (gpufrac.core.bind); on `::` it takes
IPv4 too (IPV6_V6ONLY off)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gpufrac.core.bind import host_has_ipv6, resolve_bind, split_bind

# (ok, text)
Probe = Callable[[], tuple[bool, str]]
TEXT = "text/plain; charset=utf-8"


class BindError(ValueError):
    """The listen address is malformed or cannot be listened on; the message names it."""


def registry_text(registry: CollectorRegistry) -> Callable[[], bytes]:
    """/metrics of one registry, in Prometheus text format."""
    return lambda: generate_latest(registry)


class _DualStackServer(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6 and self.server_address[0] == "::":
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # `::` takes IPv4 too
        super().server_bind()


class ProbeServer:
    def __init__(self, bind: str, metrics: Callable[[], bytes], probes: Mapping[str, Probe]) -> None:
        if ":" not in bind or not split_bind(bind)[1].isdigit():
            raise BindError(f"{bind}: expected HOST:PORT, e.g. :9475 or 0.0.0.0:9475")
        host, port = split_bind(resolve_bind(bind, os.environ.get("POD_IP"), host_has_ipv6()))
        paths = ", ".join(["/metrics", *probes])

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, metrics(), CONTENT_TYPE_LATEST)
                elif path in probes:
                    ok, text = probes[path]()
                    self._send(200 if ok else 503, (text + "\n").encode(), TEXT)
                else:
                    self._send(404, f"not found: GET {paths}\n".encode(), TEXT)

            def _send(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        server_class = type("ProbeHTTPServer", (_DualStackServer,),
                            {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
        try:
            self.server = server_class((host, int(port)), Handler)
        except OSError as err:
            raise BindError(f"{bind}: {err.strerror or err}") from err
        self._thread = threading.Thread(target=self.server.serve_forever, name="metrics-http", daemon=True)

    @property
    def host(self) -> str:
        return str(self.server.server_address[0])

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> ProbeServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
