"""Upstream CustomResourceDefinitions for the chart's optional objects, fetched at test time from the Go module
proxy (never committed): the Prometheus Operator's ServiceMonitor, PodMonitor and PrometheusRule, and
cert-manager's Issuer and Certificate. `go mod download` keeps the module in ~/.cache/gpufrac/gomod, so only the
first run reaches the proxy."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from e2e.toolkit.errors import ClusterError
from e2e.toolkit.tools import tools_cache


@dataclass(frozen=True)
class CrdSource:
    module: str
    version: str
    directory: str  # inside the module
    files: tuple[str, ...]


PROMETHEUS_OPERATOR = CrdSource(
    "github.com/prometheus-operator/prometheus-operator", "v0.85.0", "example/prometheus-operator-crd",
    ("monitoring.coreos.com_servicemonitors.yaml", "monitoring.coreos.com_podmonitors.yaml",
     "monitoring.coreos.com_prometheusrules.yaml"),
)
# deploy/crds holds the plain controller-gen output ("for reference, development and testing"); the release's
# cert-manager.crds.yaml is the same definitions with labels.
CERT_MANAGER = CrdSource(
    "github.com/cert-manager/cert-manager", "v1.21.2", "deploy/crds",
    ("cert-manager.io_issuers.yaml", "cert-manager.io_clusterissuers.yaml", "cert-manager.io_certificates.yaml",
     "cert-manager.io_certificaterequests.yaml"),
)


def module_cache() -> Path:
    return tools_cache().parent / "gomod"


def crd_files(source: CrdSource) -> list[Path]:
    """The CRD files of `source`, downloading its module once."""
    env = {**os.environ, "GOMODCACHE": str(module_cache()), "GOFLAGS": "-modcacherw", "GOTOOLCHAIN": "local"}
    try:
        result = subprocess.run(["go", "mod", "download", "-json", f"{source.module}@{source.version}"],
                                capture_output=True, text=True, timeout=600, env=env, cwd="/")
    except FileNotFoundError as exc:
        raise ClusterError("go is needed to fetch the upstream CRDs from the Go module proxy") from exc
    try:
        info = json.loads(result.stdout)
    except ValueError:
        info = {}
    if result.returncode != 0 or "Dir" not in info:
        raise ClusterError(f"go mod download {source.module}@{source.version} failed: "
                           f"{info.get('Error') or result.stderr.strip()}")
    directory = Path(info["Dir"]) / source.directory
    files = [directory / name for name in source.files]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ClusterError(f"{source.module}@{source.version} has no {', '.join(missing)}")
    return files
