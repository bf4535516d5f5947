"""The JSON patch of a mutation, without copying or diffing the whole pod.

A mutation works on a copy that shares every value it does not write (`working_copy`), so `diff` can skip those
by identity and only compare what the mutation touched. This keeps the cost of a review independent of how much
of the pod is left alone (a generic deep copy and deep diff of the pod were most of the CPU of a review).
"""

from __future__ import annotations

from typing import Any

# What a mutation may write: these are copied, everything else is shared with the request's object.
_CONTAINER_KINDS = ("containers", "initContainers", "ephemeralContainers")
_CONTAINER_LISTS = ("env", "volumeMounts")


def _copied(parent: dict[str, Any], key: str, kind: type) -> None:
    value = parent.get(key)
    if isinstance(value, kind):
        parent[key] = kind(value)


def working_copy(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of the pod safe for the mutation to write into: the maps and lists it writes are new objects."""
    pod = dict(obj)
    _copied(pod, "metadata", dict)
    metadata = pod.get("metadata")
    if isinstance(metadata, dict):
        _copied(metadata, "annotations", dict)
        _copied(metadata, "labels", dict)
    _copied(pod, "spec", dict)
    spec = pod.get("spec")
    if isinstance(spec, dict):
        for kind in _CONTAINER_KINDS:
            containers = spec.get(kind)
            if isinstance(containers, list):
                spec[kind] = [dict(c) if isinstance(c, dict) else c for c in containers]
                for container in spec[kind]:
                    if isinstance(container, dict):
                        for key in _CONTAINER_LISTS:
                            _copied(container, key, list)
        _copied(spec, "volumes", list)
        _copy_node_selector_terms(spec)
    return pod


def _copy_node_selector_terms(spec: dict[str, Any]) -> None:
    """The path to the required node selector terms' expressions, where a mutation adds its node requirement."""
    parent: Any = spec
    for key in ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"):
        _copied(parent, key, dict)
        parent = parent.get(key)
        if not isinstance(parent, dict):
            return
    terms = parent.get("nodeSelectorTerms")
    if isinstance(terms, list):
        parent["nodeSelectorTerms"] = terms = [dict(t) if isinstance(t, dict) else t for t in terms]
        for term in terms:
            if isinstance(term, dict):
                _copied(term, "matchExpressions", list)


def _pointer(path: str, key: str | int) -> str:
    return f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}"


def _diff(path: str, before: Any, after: Any, ops: list[dict[str, Any]]) -> None:
    """Called only where `before is not after`: what is shared is skipped before its pointer is even built."""
    if isinstance(before, dict) and isinstance(after, dict):
        _diff_dicts(path, before, after, ops)
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for index, (old, new) in enumerate(zip(before, after, strict=True)):
            if old is not new:
                _diff(f"{path}/{index}", old, new, ops)
    elif before != after:
        ops.append({"op": "replace", "path": path, "value": after})


def _diff_dicts(path: str, before: dict[str, Any], after: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    for key in before:
        if key not in after:
            ops.append({"op": "remove", "path": _pointer(path, key)})
    for key, value in after.items():
        if key not in before:
            ops.append({"op": "add", "path": _pointer(path, key), "value": value})
        elif before[key] is not value:
            _diff(_pointer(path, key), before[key], value, ops)


def diff(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """RFC 6902 operations turning `before` into `after`; lists that changed length are replaced whole."""
    ops: list[dict[str, Any]] = []
    if before is not after:
        _diff("", before, after, ops)
    return ops
