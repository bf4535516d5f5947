"""Gangs, as KAI's scheduler keeps them, for reclaim's victim order. Pure.

KAI places a gang (a PodGroup, `scheduling.run.ai/v2alpha2`, whose pods name it in their `pod-group-name`
annotation) only with at least `spec.minMember` of its pods running, and a gang that falls below its minimum is no
longer running as one (a distributed job's workers wait on the one that is gone). So reclaim spares a gang's members
beyond what it can lose: the members above its minimum (`status.running - spec.minMember`), none when it is at its
minimum or when the PodGroup could not be read; a PodGroup of `minMember` 1 is a single pod, no gang.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

POD_GROUP_ANNOTATION = "pod-group-name"  # KAI's podgrouper writes it on every pod it schedules
POD_GROUP_API = ("scheduling.run.ai", "v2alpha2", "podgroups")  # group, version, plural


def pod_group(annotations: Mapping[str, Any]) -> str:
    """The PodGroup a pod names ("" when none)."""
    name = annotations.get(POD_GROUP_ANNOTATION)
    return name if isinstance(name, str) else ""


@dataclass(frozen=True)
class Gang:
    namespace: str
    name: str
    min_member: int
    running: int | None  # status.running; None: the PodGroup could not be read

    @property
    def spare(self) -> int | None:
        """How many of its members reclaim may evict and keep it whole (None: any number, it is no gang)."""
        if self.running is not None and self.min_member <= 1:
            return None
        return 0 if self.running is None else max(0, self.running - self.min_member)

    def __str__(self) -> str:
        running = "unknown" if self.running is None else str(self.running)
        return f"gang {self.namespace}/{self.name} (minMember {self.min_member}, running {running})"


def read_gang(namespace: str, name: str, obj: Mapping[str, Any] | None) -> Gang | None:
    """The gang a PodGroup object makes; None when there is no such PodGroup (KAI does not hold the pod to one)."""
    if obj is None:
        return None
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    min_member, running = spec.get("minMember"), status.get("running", 0)  # KAI's defaults: 1, and none running yet
    return Gang(namespace, name, min_member if isinstance(min_member, int) else 1,
                running if isinstance(running, int) else None)


def unknown_gang(namespace: str, name: str) -> Gang:
    """A PodGroup the API server did not answer for: all of its members are spared."""
    return Gang(namespace, name, 1, None)
