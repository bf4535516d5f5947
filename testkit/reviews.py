"""The one builder of AdmissionReviews, as the API server sends them to a webhook, for tests, e2e and bench."""

from __future__ import annotations

from typing import Any

from gpufrac.webhook.decide.review import ReviewRequest, parse_review

UID = "8f7c2a10-0000-4000-8000-000000000001"


def review_body(obj: Any, *, operation: str = "CREATE", old: Any = None, user: str = "alice",
                groups: tuple[str, ...] = (), sub_resource: str = "", uid: str = UID, kind: str = "Pod",
                group: str = "", resource: str = "pods", name: str = "p", namespace: str = "team-a",
                as_sent: bool = False) -> dict[str, Any]:
    """The AdmissionReview of `operation` on `obj` (any JSON value: the hostile tests send what no API server
    would). as_sent: with the fields the API server adds that gpufrac does not read (requestKind, requestResource,
    options, the user's uid), as the bench sends them, so their cost is measured."""
    gvk = {"group": group, "version": "v1", "kind": kind}
    gvr = {"group": group, "version": "v1", "resource": resource}
    request: dict[str, Any] = {
        "uid": uid, "kind": gvk, "resource": gvr, "name": name, "namespace": namespace, "operation": operation,
        "userInfo": {"username": user, "groups": list(groups)},
        "object": obj, "oldObject": old, "dryRun": False,
    }
    if sub_resource:
        request["subResource"] = sub_resource
    if as_sent:
        request.update(requestKind=dict(gvk), requestResource=dict(gvr), options={
            "kind": "CreateOptions" if operation == "CREATE" else "UpdateOptions",
            "apiVersion": "meta.k8s.io/v1", "fieldManager": "kubectl-client-side-apply"})
        request["userInfo"]["uid"] = f"uid-{user}"
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def review(obj: Any, **kwargs: Any) -> ReviewRequest:
    """The review as the webhook's decisions read it."""
    return parse_review(review_body(obj, **kwargs))
