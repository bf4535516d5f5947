"""The operator's default compute mode (`webhook.defaultMode`): a fraction that names no mode is time-slicing, in
KAI's reading and gpufrac's, and time-slicing needs driver r615+. Where the nodes run an older driver (EKS AL2023's
580, the GPU Operator's 580/595) only sm-sharing is enforced, so such a fraction would stay Pending. With a default
mode set, the webhook writes it on CREATE as if the user had, in KAI's own keys, so KAI groups the pod by it and
every later check (gpufrac's rules, its policies, the agent) reads a written mode. Pure."""

from __future__ import annotations

import copy
from typing import Any

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import (
    ComputeMode,
    Field,
    MalformedKeyError,
    names_a_mode,
    nvidia_key,
    parse_container_key,
)
from gpufrac.webhook.decide import pod as podview

# Pod-level shorthands that ask for a fraction (the pod-level mode shorthand goes with them)
_POD_LEVEL = (ann.FRACTION, ann.MEMORY)


def with_default_mode(obj: dict[str, Any], mode: ComputeMode | None) -> dict[str, Any]:
    """`obj` with `mode` written where it asks for a fraction and names no mode anywhere; `obj` itself otherwise."""
    if mode is None:
        return obj
    annotations = podview.annotations(obj)  # a malformed pod is a 400 here, as it is in every later read
    if names_a_mode(annotations):
        return obj
    added = {ann.COMPUTE_MODE: str(mode)} if any(k in annotations for k in _POD_LEVEL) else {
        nvidia_key(container, Field.COMPUTE_MODE): str(mode) for container in _per_container(annotations)}
    if not added:
        return obj
    result = copy.deepcopy(obj)
    result["metadata"]["annotations"].update(added)
    return result


def _per_container(annotations: dict[str, Any]) -> list[str]:
    """The containers that ask for GPU memory by KAI's per-container keys."""
    found = []
    for key in annotations:
        if not isinstance(key, str) or not key.startswith(ann.NVIDIA_PREFIX):
            continue
        try:
            parsed = parse_container_key(key)
        except MalformedKeyError:
            continue
        if parsed is not None and parsed.suffix in (Field.MEMORY_REQUEST, Field.MEMORY_LIMIT) \
                and parsed.container not in found:
            found.append(parsed.container)
    return found
