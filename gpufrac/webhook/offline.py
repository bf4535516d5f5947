"""`gpufrac review`: what the API server would do with a pod (mutate, apply the patch, validate), offline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jsonpatch

from gpufrac.webhook import admission
from gpufrac.webhook.errors import BadReviewError
from gpufrac.webhook.policy import Policy, UserInfo
from gpufrac.webhook.review import ReviewRequest


@dataclass(frozen=True)
class OfflineResult:
    allowed: bool
    message: str
    warnings: list[str]
    patch: list[dict[str, Any]]
    object: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"allowed": self.allowed, "message": self.message, "warnings": self.warnings, "patch": self.patch,
                "object": self.object}


def _request(obj: dict[str, Any], old: dict[str, Any] | None, user: UserInfo) -> ReviewRequest:
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    return ReviewRequest(
        uid="offline", operation="UPDATE" if old is not None else "CREATE", kind="Pod", resource="pods",
        sub_resource="", namespace=str(metadata.get("namespace", "")), name=str(metadata.get("name", "")),
        user=user, obj=obj, old_obj=old, dry_run=True,
    )


def review(obj: Any, old: Any, user: UserInfo, policy: Policy) -> OfflineResult:
    if not isinstance(obj, dict) or obj.get("kind", "Pod") != "Pod":
        raise BadReviewError("the manifest must be a single Pod")
    if old is not None and not isinstance(old, dict):
        raise BadReviewError("the old manifest must be a single Pod")
    mutated = admission.mutate(_request(obj, old, user), policy)
    if not mutated.allowed:
        return OfflineResult(False, mutated.message, mutated.warnings, [], obj)
    patched = jsonpatch.apply_patch(obj, mutated.patch)
    validated = admission.validate(_request(patched, old, user), policy)
    return OfflineResult(validated.allowed, validated.message, mutated.warnings + validated.warnings,
                         mutated.patch, patched)
