"""Helpers for the end-to-end scenarios (tests/e2e): manifests, kubectl calls, assertions."""

from __future__ import annotations

import itertools
import json
import re

from e2e.kubectl import Kubectl, KubectlResult
from e2e.names import NODE_NAME, USER_NAMESPACE
from testkit import pods

# Refused by a gpufrac webhook, or by one of the ValidatingAdmissionPolicies the chart generates from its rules.
DENIED = re.compile(r'admission webhook "(validate|mutate)\.gpufrac\.io" denied the request'
                    r"|ValidatingAdmissionPolicy 'gpufrac-[a-z-]+' with binding 'gpufrac-[a-z-]+' denied request")

# ---- manifests ---------------------------------------------------------------------------------------------

_counter = itertools.count(1)


def unique(prefix: str) -> str:
    """A name no other object of this session has (for a test that makes several of one kind in its namespace)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", prefix.lower()).strip("-")[:40].rstrip("-")
    return f"{slug}-{next(_counter)}"


def pod(
    name: str, annotations: dict[str, str] | None = None, containers: list[dict] | None = None, *,
    namespace: str = USER_NAMESPACE, **spec: object
) -> dict:
    """A Pod manifest for KAI's scheduler in `namespace` (the users' by default; testkit.pods.pod); containers
    default to one `app` container."""
    return pods.pod(annotations, *(containers or ()), name=name, namespace=namespace,
                    spec={"schedulerName": "kai-scheduler", **spec})


def example(filename: str, name: str | None = None, namespace: str = USER_NAMESPACE) -> dict:
    """A manifest of examples/ in `namespace` (the users' by default)."""
    return pods.example(filename, name, namespace=namespace)


def create(kubectl: Kubectl, obj: dict, *extra: str) -> KubectlResult:
    return kubectl("create", "-f", "-", "-o", "json", *extra, input=json.dumps(obj))


def get_pod(kubectl: Kubectl, name: str) -> dict:
    rc, out, err = kubectl("get", "pod", name, "-o", "json")
    assert rc == 0, err
    return json.loads(out)


def container(pod_obj: dict, name: str = "app") -> dict:
    return next(c for c in pod_obj["spec"]["containers"] if c["name"] == name)


def env_of(ctr: dict) -> dict[str, dict]:
    return {e["name"]: e for e in ctr.get("env", [])}

def bind(binder: Kubectl, name: str, annotations: dict[str, str], namespace: str = USER_NAMESPACE) -> None:
    """What KAI's binder does: one merge patch of the annotations, then POST pods/binding."""
    rc, _, err = binder(
        "patch", "pod", name, "--type=merge", "-p", json.dumps({"metadata": {"annotations": annotations}})
    )
    assert rc == 0, f"binder's annotation patch refused: {err}"
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME},
    }
    rc, _, err = binder(
        "create",
        "--raw",
        f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
        "-f",
        "-",
        input=json.dumps(binding),
    )
    assert rc == 0, f"binding refused: {err}"


def assert_denied(res: KubectlResult, *fragments: str) -> str:
    """The request was refused by one of our webhooks or policies, and the message names every fragment (the
    annotation key, its value, …). Returns kubectl's stderr."""
    assert res.rc != 0, f"expected a denial, but kubectl succeeded: {res.stdout[:500]}"
    msg = res.stderr
    assert DENIED.search(msg), f"not denied by a gpufrac webhook: {msg}"
    for frag in fragments:
        assert frag in msg, f"denial does not mention {frag!r}: {msg}"
    return msg


def metric_total(text: str, name: str = "gpufrac_admission_reviews_total") -> float:
    """Sum of a Prometheus counter over all its label sets."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total
