"""Typed, checked reads of the raw Pod an AdmissionReview carries.

The API server only sends well-formed pods, but the webhook must answer anything with a clear 400 rather than a
500: every read that could meet a wrong type goes through here and raises BadReviewError.

No `from __future__ import annotations` here: it would make the name `annotations` (the reader below) the
compiler feature for the type checker.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpufrac.webhook.decide.errors import BadReviewError


class ContainerKind(StrEnum):
    CONTAINER = "containers"
    INIT = "initContainers"
    EPHEMERAL = "ephemeralContainers"


@dataclass(frozen=True)
class ContainerRef:
    kind: ContainerKind
    index: int
    name: str
    spec: dict[str, Any]


def _mapping(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadReviewError(f"{where}.{key} must be an object, got {type(value).__name__}")
    return value


def _list(parent: dict[str, Any], key: str, where: str) -> list[Any]:
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadReviewError(f"{where}.{key} must be a list, got {type(value).__name__}")
    return value


def child_object(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """parent[key] as an object, created empty when absent, so a mutation can write into it."""
    value = _mapping(parent, key, where)
    parent[key] = value
    return value


def child_list(parent: dict[str, Any], key: str, where: str) -> list[Any]:
    value = _list(parent, key, where)
    parent[key] = value
    return value


def string_map(obj: dict[str, Any], key: str) -> dict[str, str]:
    """metadata.annotations or metadata.labels; every value must be a string."""
    metadata = _mapping(obj, "metadata", "object")
    values = _mapping(metadata, key, "object.metadata")
    for name, value in values.items():
        if not isinstance(value, str):
            raise BadReviewError(f"object.metadata.{key}[{name!r}] must be a string")
    return values


def annotations(obj: dict[str, Any]) -> dict[str, str]:
    return string_map(obj, "annotations")


def labels(obj: dict[str, Any]) -> dict[str, str]:
    return string_map(obj, "labels")


def spec(obj: dict[str, Any]) -> dict[str, Any]:
    return _mapping(obj, "spec", "object")


def containers(obj: dict[str, Any], *kinds: ContainerKind) -> Iterator[ContainerRef]:
    """Containers of the given kinds (all kinds by default), each checked to be an object with a string name."""
    pod_spec = spec(obj)
    for kind in kinds or tuple(ContainerKind):
        for index, item in enumerate(_list(pod_spec, kind, "object.spec")):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise BadReviewError(f"object.spec.{kind}[{index}] must be an object with a string name")
            yield ContainerRef(kind, index, item["name"], item)


def env(container: ContainerRef) -> list[dict[str, Any]]:
    entries = _list(container.spec, "env", f"{container.kind}[{container.index}]")
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise BadReviewError(f"{container.kind}[{container.index}].env entries must have a string name")
    return entries


def volume_mounts(container: ContainerRef) -> list[dict[str, Any]]:
    entries = _list(container.spec, "volumeMounts", f"{container.kind}[{container.index}]")
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise BadReviewError(f"{container.kind}[{container.index}].volumeMounts entries need a string name")
    return entries


def volumes(obj: dict[str, Any]) -> list[dict[str, Any]]:
    entries = _list(spec(obj), "volumes", "object.spec")
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise BadReviewError("object.spec.volumes entries must be objects with a string name")
    return entries


def resource_names(container: ContainerRef) -> set[str]:
    """Resource names a container requests or limits."""
    resources = _mapping(container.spec, "resources", f"{container.kind}[{container.index}]")
    names: set[str] = set()
    for section in ("limits", "requests"):
        names.update(_mapping(resources, section, f"{container.kind}[{container.index}].resources"))
    return names


def security_context(container: ContainerRef) -> dict[str, Any]:
    return _mapping(container.spec, "securityContext", f"{container.kind}[{container.index}]")


def added_capabilities(container: ContainerRef) -> list[str]:
    capabilities = _mapping(security_context(container), "capabilities", "securityContext")
    return [c for c in _list(capabilities, "add", "securityContext.capabilities") if isinstance(c, str)]
