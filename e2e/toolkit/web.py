"""HTTP(S) GETs for readiness checks and scrapes, against a given CA (or none: a readiness probe)."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from pathlib import Path


def ssl_context(ca_file: Path | None) -> ssl.SSLContext:
    if ca_file is None:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    return ssl.create_default_context(cafile=str(ca_file))


def https_get(url: str, ca_file: Path | None = None, token: str | None = None,
              timeout: float = 3.0) -> tuple[int, str]:
    """(status, body) of GET `url`; an HTTP error status is returned, not raised."""
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    context = ssl_context(ca_file) if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def answers_200(url: str, ca_file: Path | None = None, token: str | None = None) -> bool:
    """A readiness check: GET `url` answers 200."""
    return https_get(url, ca_file, token)[0] == 200
