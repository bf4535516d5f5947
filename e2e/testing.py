"""Helpers for the end-to-end scenarios (tests/e2e): manifests, kubectl calls, assertions."""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Callable

import yaml

from e2e.cluster import REPO_ROOT, USER_NAMESPACE, KubectlResult

EXAMPLES = REPO_ROOT / "examples"
IMAGE = "nvcr.io/nvidia/cuda:13.0.2-base-ubuntu24.04"
DENIED = re.compile(r'admission webhook "(validate|mutate)\.gpufrac\.io" denied the request')

Kubectl = Callable[..., KubectlResult]

# ---- manifests ---------------------------------------------------------------------------------------------

_counter = itertools.count(1)


def unique(prefix: str) -> str:
    """A pod name no other test uses in this session (they all share namespace team-a)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", prefix.lower()).strip("-")[:40].rstrip("-")
    return f"{slug}-{next(_counter)}"


def pod(
    name: str, annotations: dict[str, str] | None = None, containers: list[dict] | None = None, **spec: object
) -> dict:
    """A Pod manifest; containers default to one `app` container."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": USER_NAMESPACE, "annotations": dict(annotations or {})},
        "spec": {
            "schedulerName": "kai-scheduler",
            "containers": containers or [{"name": "app", "image": IMAGE}],
            **spec,
        },
    }


def example(filename: str, name: str | None = None) -> dict:
    doc = yaml.safe_load((EXAMPLES / filename).read_text())
    doc = copy.deepcopy(doc)
    if name:
        doc["metadata"]["name"] = name
    doc["metadata"]["namespace"] = USER_NAMESPACE
    return doc


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


def assert_denied(res: KubectlResult, *fragments: str) -> str:
    """The request was refused by one of our webhooks, and the message names every fragment (the annotation
    key, its value, …). Returns kubectl's stderr."""
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
