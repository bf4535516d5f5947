"""The chart rendered by the real helm (`make tools`), and readers of what it renders, for the chart tests."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit import REPO_ROOT

CHART = REPO_ROOT / "charts" / "gpufrac"
TOOLS = Path(os.environ.get("GPUFRAC_TOOLS_CACHE", Path.home() / ".cache" / "gpufrac" / "tools"))
HELM = TOOLS / "bin" / "helm"
NS = "gpufrac-system"
K8S_VERSION = "1.36.0"
CERT_MANAGER = ["--set", "certs.mode=cert-manager"]

# The mark of every test that renders the chart: skipped without helm.
needs_helm = pytest.mark.skipif(
    not os.access(HELM, os.X_OK), reason=f"helm not found at {HELM} (build it with `make tools`)"
)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, check=check, timeout=120)


def template(*args: str, namespace: str = NS, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart with these flags (check=False: to read a refusal)."""
    return helm("template", "gpufrac", str(CHART), "--namespace", namespace, *args, check=check)


def render(*args: str, namespace: str = NS) -> list[dict[str, Any]]:
    return [o for o in yaml.safe_load_all(template(*args, namespace=namespace).stdout) if o]


def find(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def pod_policies(objs: list[dict[str, Any]], kind: str = "ValidatingAdmissionPolicy") -> list[dict[str, Any]]:
    """The webhook's admission policies on pods (of `kind`), not the agent's own-node ones."""
    return [o for o in objs if o["kind"] == kind
            and o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "webhook"]


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(objs, kind, name)
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


def webhook(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    cfg = one(objs, kind)
    names = [w["name"] for w in cfg["webhooks"]]
    expected = ["mutate.gpufrac.io"] if kind == "MutatingWebhookConfiguration" else \
        ["validate.gpufrac.io", "validate-workloads.gpufrac.io"]
    assert names == expected
    found: dict[str, Any] = cfg["webhooks"][names.index(name)]
    return found


def mutating(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return webhook(objs, "MutatingWebhookConfiguration", "mutate.gpufrac.io")


def validating(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return webhook(objs, "ValidatingWebhookConfiguration", "validate.gpufrac.io")


def workloads(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """The validating webhook for the pod templates of Deployments, Jobs, ...."""
    return webhook(objs, "ValidatingWebhookConfiguration", "validate-workloads.gpufrac.io")


def container(workload: dict[str, Any]) -> dict[str, Any]:
    spec = workload["spec"]["template"]["spec"] if workload["kind"] != "CronJob" \
        else workload["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    c: dict[str, Any]
    (c,) = spec["containers"]
    return c


def arg_value(args: list[str], flag: str) -> list[str]:
    """Every value given to `flag` in a container's args."""
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]
