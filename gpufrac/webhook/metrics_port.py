"""The webhook's metrics on their own plain-HTTP port (`--metrics-bind`), so Prometheus scrapes them without the
chart's CA and the admission port serves only the API server. Runs in the gunicorn master: it reads every
worker's values from the multiprocess directory, and the expiry of the certificates the workers serve."""

from __future__ import annotations

import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST

from gpufrac.core.bind import split_bind
from gpufrac.webhook import metrics

log = logging.getLogger("gpufrac.webhook")


class _Handler(BaseHTTPRequestHandler):
    certs_dir: Path

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            body = metrics.render([metrics.CertificateCollector(self.certs_dir)])
            self._send(200, body, CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            self._send(200, b"ok\n", "text/plain; charset=utf-8")
        else:
            self._send(404, b"not found: GET /metrics\n", "text/plain; charset=utf-8")

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6 and self.server_address[0] == "::":
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # `::` takes IPv4 too
        super().server_bind()


class MetricsListener:
    """`bind` is HOST:PORT with a host already resolved (see gpufrac.core.bind.resolve_bind)."""

    def __init__(self, bind: str, certs_dir: Path) -> None:
        host, port = split_bind(bind)
        handler = type("MetricsHandler", (_Handler,), {"certs_dir": certs_dir})
        server_class = type("MetricsServer", (_Server,),
                            {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
        self.server = server_class((host, int(port)), handler)
        self._thread = threading.Thread(target=self.server.serve_forever, name="metrics-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> MetricsListener:
        self._thread.start()
        log.info("metrics", extra={"bind": self.server.server_address[0], "port": self.port})
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
