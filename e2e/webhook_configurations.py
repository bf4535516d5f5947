"""The chart's own Mutating/ValidatingWebhookConfiguration (and its ValidatingAdmissionPolicies) for a local
webhook: rendered with ``helm template … --show-only …`` in URL mode, and the waits until the API server uses
them (it loads both from informers, so the first test must not race them)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

from e2e.kubectl import Kubectl, KubectlResult
from e2e.names import CHART_DIR, RELEASE_NAMESPACE, USER_NAMESPACE
from e2e.toolkit.errors import ClusterError
from e2e.toolkit.procs import tail
from e2e.toolkit.wait import WaitTimeoutError, wait_until
from gpufrac.core.contract import FRACTIONAL_LABEL

WEBHOOK_TEMPLATES = (
    "templates/webhook/mutatingwebhookconfiguration.yaml",
    "templates/webhook/validatingwebhookconfiguration.yaml",
)
# The ValidatingAdmissionPolicies generated from the webhook's rule table (chart value policies.enabled).
POLICY_TEMPLATE = "templates/policies/validatingadmissionpolicies.yaml"
POLICY_DENIED = "ValidatingAdmissionPolicy 'gpufrac-"
POLICY_PROBE, POLICY_PROBE_NAMESPACE = "e2e-policy-probe", "default"

def render(helm: str, helm_home: Path, webhook_url: str, ca_file: Path, *values: str, policies: bool,
           kube_version: str = "") -> str:
    """The two webhook configurations pointed at `webhook_url` with `ca_file` as caBundle, and with `policies`
    the ValidatingAdmissionPolicies; `values`: more `--set k=v` pairs."""
    if not (CHART_DIR / "Chart.yaml").exists():
        raise ClusterError(f"chart not found at {CHART_DIR}")
    ca_b64 = base64.b64encode(ca_file.read_bytes()).decode()
    argv = [
        helm, "template", "gpufrac", str(CHART_DIR), "--namespace", RELEASE_NAMESPACE,
        "--set", f"webhook.clientConfig.url={webhook_url}",
        "--set", f"webhook.clientConfig.caBundle={ca_b64}",
        "--set", f"policies.enabled={str(policies).lower()}",
        *(arg for v in values for arg in ("--set", v)),
    ]
    if kube_version:
        argv += ["--kube-version", kube_version]
    for tpl in (*WEBHOOK_TEMPLATES, *((POLICY_TEMPLATE,) if policies else ())):
        argv += ["--show-only", tpl]
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(helm_home / "cache"),
        "HELM_CONFIG_HOME": str(helm_home / "config"),
        "HELM_DATA_HOME": str(helm_home / "data"),
    }
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    if res.returncode != 0:
        raise ClusterError(f"helm template failed: {res.stderr.strip()}")
    return res.stdout


def _probe_pod(name: str, annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
               namespace: str = USER_NAMESPACE) -> str:
    metadata: dict[str, object] = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = annotations
    if labels:
        metadata["labels"] = labels
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
                       "spec": {"containers": [{"name": "app", "image": "busybox"}]}})


def wait_webhook_active(kubectl: Kubectl, webhook_log: Path, timeout: float = 30,
                        gate_labels: dict[str, str] | None = None) -> None:
    """Until a fractional dry-run pod (carrying `gate_labels`, the label gate's, where it is on) comes back mutated."""
    probe = _probe_pod("e2e-webhook-probe", annotations={"gpu-fraction": "0.5"}, labels=gate_labels)

    def mutated() -> bool:
        res = kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=probe)
        return res.rc == 0 and FRACTIONAL_LABEL in res.stdout

    try:
        wait_until(mutated, timeout, "the webhook configurations to be active", interval=0.5)
    except WaitTimeoutError as exc:
        raise ClusterError(f"webhook configurations applied but a fractional dry-run pod is not mutated ({exc}); "
                           f"webhook log:\n{tail(webhook_log)}") from exc


def policy_probe(kubectl: Kubectl, gate_labels: dict[str, str] | None = None) -> KubectlResult:
    """A request only the policies deny where they are bound: the fractional label put on a plain pod (a server-side
    dry run; the validating webhook denies it too, but the API server runs the policies first). The pod, which no
    webhook or policy looks at, is made once in a namespace both judge (with `gate_labels`, the label gate's, where
    it is on). A CREATE would not do: where the mutating webhook fails closed it judges a pod's CREATE alone."""
    created = kubectl("apply", "--namespace", POLICY_PROBE_NAMESPACE, "-f", "-",
                      input=_probe_pod(POLICY_PROBE, labels=gate_labels, namespace=POLICY_PROBE_NAMESPACE))
    if created.rc != 0:
        raise ClusterError(f"creating the policies' probe pod: {created.stderr.strip()}")
    return kubectl("label", "pod", POLICY_PROBE, "-n", POLICY_PROBE_NAMESPACE, f"{FRACTIONAL_LABEL}=true",
                   "--dry-run=server")


def wait_policies_active(kubectl: Kubectl, apiserver_log: Path, timeout: float = 30,
                         gate_labels: dict[str, str] | None = None) -> None:
    """Until the policy probe is denied by a policy."""
    def denied() -> bool:
        res = policy_probe(kubectl, gate_labels)
        return res.rc != 0 and POLICY_DENIED in res.stderr

    try:
        wait_until(denied, timeout, "the ValidatingAdmissionPolicies to be active", interval=0.5)
    except WaitTimeoutError as exc:
        raise ClusterError(f"policies applied but a pod they deny is admitted ({exc}); kube-apiserver log:\n"
                           f"{tail(apiserver_log)}") from exc
