"""Bootstrap objects as data: the YAML files in bootstrap/, applied in the order a cluster kind lists them."""

from __future__ import annotations

from pathlib import Path

import yaml

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"

# Every cluster kind starts with these; the API-only one adds its kubelet-less node.
COMMON = ("namespaces.yaml", "service-accounts.yaml", "alice.yaml", "binder.yaml")
API_ONLY = (*COMMON, "api-only-node.yaml")


def load(*files: str) -> list[dict]:
    """The objects of `files` (in bootstrap/), in order."""
    objects: list[dict] = []
    for name in files:
        objects += [doc for doc in yaml.safe_load_all((BOOTSTRAP_DIR / name).read_text()) if doc]
    return objects
