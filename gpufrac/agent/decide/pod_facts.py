"""What orders reclaim's candidates, read from a pod as the API server has it (reclaim.PodFacts). Pure."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from gpufrac.agent.decide.gangs import pod_group, sub_group
from gpufrac.agent.decide.reclaim import PodFacts
from gpufrac.core.owners import controller_of


def _timestamp(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return dt.datetime.fromisoformat(text).timestamp()  # Python 3.11 reads the API server's `Z`
    except ValueError:
        return None


def pod_facts(pods: Iterable[Mapping[str, Any]]) -> dict[str, PodFacts]:
    """By pod UID: spec.priority (0 when unset), status.startTime (else the creation time), and whether it is being
    deleted."""
    facts = {}
    for pod in pods:
        metadata = pod.get("metadata") or {}
        priority = (pod.get("spec") or {}).get("priority")
        started = _timestamp((pod.get("status") or {}).get("startTime")) or _timestamp(
            metadata.get("creationTimestamp")
        )
        facts[str(metadata.get("uid", ""))] = PodFacts(
            str(metadata.get("name", "")),
            priority if isinstance(priority, int) else 0,
            started or 0.0,
            terminating=bool(metadata.get("deletionTimestamp")),
            pod_group=pod_group(metadata.get("annotations") or {}),
            sub_group=sub_group(metadata.get("labels") or {}),
            owner=controller_of(metadata),
        )
    return facts
