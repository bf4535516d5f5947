"""Small builders for pods and AdmissionReviews, so each test shows only what it is about."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from gpufrac.webhook.policy import Policy, UserInfo
from gpufrac.webhook.review import ReviewRequest, parse_review

BINDER = "system:serviceaccount:kai-scheduler:binder"
POLICY = Policy()


def pod(annotations: dict[str, str] | None = None, *containers: str, init: tuple[str, ...] = (),
        **container_fields: Any) -> dict[str, Any]:
    """A pod with the given annotations and containers (default one named `app`)."""
    names = containers or ("app",)
    spec: dict[str, Any] = {"containers": [{"name": n, "image": "nvcr.io/nvidia/cuda:13.0.2-base-ubuntu24.04",
                                            **copy.deepcopy(container_fields)} for n in names]}
    if init:
        spec["initContainers"] = [{"name": n, "image": "busybox"} for n in init]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "team-a", "annotations": dict(annotations or {})},
            "spec": spec}


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example_annotations(name: str) -> dict[str, str]:
    """The annotations of a manifest in examples/ (the seed document's pods live there, once)."""
    return yaml.safe_load((EXAMPLES / name).read_text())["metadata"]["annotations"]


INFERENCE = example_annotations("inference-sm-sharing.yaml")  # the 4-GPU sm-sharing inference server
NOTEBOOK = example_annotations("notebook-time-slicing.yaml")  # the 2-GPU time-slicing notebook


def review_body(obj: dict[str, Any] | None, *, operation: str = "CREATE", old: dict[str, Any] | None = None,
                user: str = "alice", groups: tuple[str, ...] = (), sub_resource: str = "",
                uid: str = "8f7c2a10-0000-4000-8000-000000000001") -> dict[str, Any]:
    request: dict[str, Any] = {
        "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": operation,
        "userInfo": {"username": user, "groups": list(groups)}, "object": obj, "oldObject": old,
        "namespace": "team-a", "name": "p", "dryRun": False,
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def review(obj: dict[str, Any] | None, **kwargs: Any) -> ReviewRequest:
    return parse_review(review_body(obj, **kwargs))


def user(name: str = "alice") -> UserInfo:
    return UserInfo(name, ("system:authenticated",))
