"""AdmissionReview v1 on the wire: a checked request in, a response out. Pure."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from gpufrac.webhook.decide.errors import BadReviewError
from gpufrac.webhook.decide.policy import UserInfo

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
# The API server cuts each warning at 256 characters and drops them past about 4 KiB in all.
WARNING_MAX = 256
WARNINGS_TOTAL_MAX = 4000


@dataclass(frozen=True)
class ReviewRequest:
    uid: str
    operation: str
    kind: str
    resource: str
    sub_resource: str
    namespace: str
    name: str
    user: UserInfo
    obj: dict[str, Any] | None
    old_obj: dict[str, Any] | None
    dry_run: bool


def _string(value: Any, where: str, required: bool = False) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise BadReviewError(f"{where} must be a {'non-empty ' if required else ''}string")
    return value


def _object(value: Any, where: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadReviewError(f"{where} must be an object or null")
    return value


def parse_review(body: Any) -> ReviewRequest:
    """Check the envelope and the fields we use; everything else in the object is checked where it is read."""
    if not isinstance(body, dict):
        raise BadReviewError("the body must be a JSON object (an AdmissionReview)")
    if body.get("apiVersion") != API_VERSION or body.get("kind") != KIND:
        raise BadReviewError(f"expected apiVersion {API_VERSION} and kind {KIND}, got "
                             f"{str(body.get('apiVersion'))[:64]!r} and {str(body.get('kind'))[:64]!r}")
    request = body.get("request")
    if not isinstance(request, dict):
        raise BadReviewError("the AdmissionReview has no request object")
    operation = _string(request.get("operation"), "request.operation", required=True)
    if operation not in OPERATIONS:
        raise BadReviewError(f"request.operation must be one of {', '.join(OPERATIONS)}")
    kind = request.get("kind") or {}
    resource = request.get("resource") or {}
    if not isinstance(kind, dict) or not isinstance(resource, dict):
        raise BadReviewError("request.kind and request.resource must be objects")
    user = request.get("userInfo") or {}
    if not isinstance(user, dict):
        raise BadReviewError("request.userInfo must be an object")
    groups = user.get("groups") or []
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise BadReviewError("request.userInfo.groups must be a list of strings")
    dry_run = request.get("dryRun", False)
    if dry_run is not None and not isinstance(dry_run, bool):
        raise BadReviewError("request.dryRun must be a boolean")
    return ReviewRequest(
        uid=_string(request.get("uid"), "request.uid", required=True),
        operation=operation,
        kind=_string(kind.get("kind"), "request.kind.kind"),
        resource=_string(resource.get("resource"), "request.resource.resource"),
        sub_resource=_string(request.get("subResource"), "request.subResource"),
        namespace=_string(request.get("namespace"), "request.namespace"),
        name=_string(request.get("name"), "request.name"),
        user=UserInfo(_string(user.get("username"), "request.userInfo.username"), tuple(groups)),
        obj=_object(request.get("object"), "request.object"),
        old_obj=_object(request.get("oldObject"), "request.oldObject"),
        dry_run=bool(dry_run),
    )


def _cap_warnings(warnings: list[str]) -> list[str]:
    kept: list[str] = []
    total = 0
    for warning in dict.fromkeys(warnings):
        text = warning if len(warning) <= WARNING_MAX else warning[: WARNING_MAX - 1] + "…"
        if total + len(text) > WARNINGS_TOTAL_MAX:
            break
        kept.append(text)
        total += len(text)
    return kept


def build_response(uid: str, *, allowed: bool, message: str = "", patch: list[dict[str, Any]] | None = None,
                   warnings: list[str] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": message}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
    if warnings:
        response["warnings"] = _cap_warnings(warnings)
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}
