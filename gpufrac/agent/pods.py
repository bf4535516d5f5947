"""From pod objects (as JSON dicts) to the fractional containers running on this node. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpufrac.agent.model import FractionalContainer
from gpufrac.agent.procfs import normalize_container_id
from gpufrac.core.annotations import read_canonical


def fractional_containers(pod: Mapping[str, Any]) -> list[FractionalContainer]:
    """The running containers of a pod that carry canonical fraction annotations, with their container IDs."""
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    canonical = read_canonical(metadata.get("annotations") or {})
    if not canonical:
        return []
    result = []
    for container_status in status.get("containerStatuses") or []:
        name = container_status.get("name")
        container_id = container_status.get("containerID")
        running = (container_status.get("state") or {}).get("running") is not None
        if name in canonical and container_id and running:
            result.append(
                FractionalContainer(
                    namespace=metadata.get("namespace", ""),
                    pod=metadata.get("name", ""),
                    pod_uid=metadata.get("uid", ""),
                    container=name,
                    container_id=normalize_container_id(container_id),
                    spec=canonical[name],
                )
            )
    return result


def index_by_container_id(pods: Iterable[Mapping[str, Any]]) -> dict[str, FractionalContainer]:
    return {c.container_id: c for pod in pods for c in fractional_containers(pod)}
