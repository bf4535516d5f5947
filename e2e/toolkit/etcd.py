"""etcd: one member on loopback, no fsync (tests, not durability, on a shared 2-core box)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path


def argv(binary: str, data_dir: Path, client_port: int, peer_port: int) -> list[str]:
    client, peer = client_url(client_port), f"http://127.0.0.1:{peer_port}"
    return [
        binary, "--name", "e2e", "--data-dir", str(data_dir),
        "--listen-client-urls", client, "--advertise-client-urls", client,
        "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
        "--initial-cluster", f"e2e={peer}", "--initial-cluster-state", "new",
        "--unsafe-no-fsync", "--quota-backend-bytes", str(512 * 1024 * 1024), "--log-level", "warn",
    ]


def client_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def healthy(port: int) -> bool:
    with urllib.request.urlopen(f"{client_url(port)}/health", timeout=2) as resp:
        return json.loads(resp.read()).get("health") == "true"
