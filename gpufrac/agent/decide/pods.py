"""From pod objects (as JSON dicts) to the fractional containers running on this node. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufrac.agent.decide.model import RunningContainer
from gpufrac.agent.decide.proc_text import normalize_container_id
from gpufrac.core.contract import CanonicalRead, read_canonical


@dataclass(frozen=True)
class ContainerIndex:
    """The running fractional containers of this node's pods, by container ID."""

    by_id: dict[str, RunningContainer]
    # Containers (or keys naming none) whose canonical annotations do not parse: not audited, but counted.
    unreadable: int = 0


def _running(pod: Mapping[str, Any], canonical: CanonicalRead) -> list[RunningContainer]:
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    result = []
    for container_status in status.get("containerStatuses") or []:
        name = container_status.get("name")
        container_id = container_status.get("containerID")
        running = (container_status.get("state") or {}).get("running") is not None
        if name in canonical.fractions and container_id and running:
            result.append(
                RunningContainer(
                    namespace=metadata.get("namespace", ""),
                    pod=metadata.get("name", ""),
                    pod_uid=metadata.get("uid", ""),
                    container=name,
                    container_id=normalize_container_id(container_id),
                    fraction=canonical.fractions[name],
                )
            )
    return result


def _canonical(pod: Mapping[str, Any]) -> CanonicalRead:
    return read_canonical((pod.get("metadata") or {}).get("annotations") or {})


def fractional_containers(pod: Mapping[str, Any]) -> list[RunningContainer]:
    """The running containers of a pod that carry canonical fraction annotations, with their container IDs."""
    return _running(pod, _canonical(pod))


def index_by_container_id(pods: Iterable[Mapping[str, Any]]) -> ContainerIndex:
    by_id: dict[str, RunningContainer] = {}
    unreadable = 0
    for pod in pods:
        canonical = _canonical(pod)
        unreadable += len({(u.container, u.key if u.container is None else "") for u in canonical.unreadable})
        by_id.update((c.container_id, c) for c in _running(pod, canonical))
    return ContainerIndex(by_id, unreadable)


_DONE = ("Succeeded", "Failed")


def placed_fractions(pods: Iterable[Mapping[str, Any]]) -> list[RunningContainer]:
    """Every fractional container of the node's pods that are bound and not done, started or not (its container_id
    empty until it runs): what the sm-sharing daemon must hold before the container's process connects."""
    placed = []
    for pod in pods:
        metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
        if status.get("phase") in _DONE or metadata.get("deletionTimestamp"):
            continue
        ids = {s.get("name"): normalize_container_id(s["containerID"])
               for s in status.get("containerStatuses") or [] if s.get("containerID")}
        for name, fraction in _canonical(pod).fractions.items():
            if fraction.devices:
                placed.append(RunningContainer(metadata.get("namespace", ""), metadata.get("name", ""),
                                               metadata.get("uid", ""), name, ids.get(name, ""), fraction))
    return placed
