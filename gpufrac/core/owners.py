"""A pod's controller (its ownerReference with `controller: true`), as the webhook and the agent both read it: the
agent tells a controller when reclaim evicts one of its pods and keeps its pods off the node for the back-off, and the
webhook gives each fractional pod the node affinity that back-off needs (contract.reclaim_backoff_label). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_FIELDS = ("apiVersion", "kind", "name", "uid")


@dataclass(frozen=True)
class Owner:
    api_version: str
    kind: str
    name: str
    uid: str


def controller_of(metadata: Mapping[str, Any]) -> Owner | None:
    """The pod's controller (a ReplicaSet, a StatefulSet, a Job...), None for a bare pod or unreadable references."""
    refs = metadata.get("ownerReferences")
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, dict) and ref.get("controller") is True and all(
                isinstance(ref.get(k), str) and ref[k] for k in _FIELDS):
            return Owner(ref["apiVersion"], ref["kind"], ref["name"], ref["uid"])
    return None
