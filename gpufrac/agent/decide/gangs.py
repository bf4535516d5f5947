"""Gangs, as KAI's scheduler keeps them, for reclaim's victim order. Pure.

KAI places a gang (a PodGroup, `scheduling.run.ai/v2alpha2`, whose pods name it in their `pod-group-name`
annotation) only with at least `spec.minMember` of its pods running, and a gang that falls below its minimum is no
longer running as one (a distributed job's workers wait on the one that is gone). So reclaim spares a gang's members
beyond what it can lose: the members above its minimum (`status.running - spec.minMember`), none when it is at its
minimum or when the PodGroup could not be read; a PodGroup of `minMember` 1 is a single pod, no gang.

KAI 0.18's PodGroup may also hold sub-groups (`spec.subGroups`: `name`, `minMember`, an optional `parent`), each
pod naming its leaf sub-group in the label `kai.scheduler/subgroup-name`; KAI places the gang only with every
sub-group at its own minimum. The PodGroup's status counts no sub-group's running pods, so those are counted from the
API server (the namespace's pods with that label and the gang's annotation, running and not deleted): a member is
spared beyond what its gang and its leaf sub-group can each lose. A parent sub-group's own minimum is not followed
(its children's are).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

POD_GROUP_ANNOTATION = "pod-group-name"  # KAI's podgrouper writes it on every pod it schedules
SUB_GROUP_LABEL = "kai.scheduler/subgroup-name"  # a pod's leaf sub-group of its PodGroup (KAI 0.18)
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
    sub_groups: Mapping[str, int] = field(default_factory=dict)  # spec.subGroups: name -> minMember
    sub: bool = False  # a sub-group (`name` is `<PodGroup>/<sub-group>`): one of minMember 1 is still needed whole

    @property
    def spare(self) -> int | None:
        """How many of its members reclaim may evict and keep it whole (None: any number, it is no gang)."""
        if self.running is not None and self.min_member <= 1 and not self.sub:
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
    sub_groups: dict[str, int] = {}
    for sub in spec.get("subGroups") or []:
        if isinstance(sub, dict) and isinstance(sub.get("name"), str):
            minimum = sub.get("minMember")
            sub_groups[sub["name"]] = minimum if isinstance(minimum, int) else 1  # KAI's default, as the gang's
    return Gang(namespace, name, min_member if isinstance(min_member, int) else 1,
                running if isinstance(running, int) else None, sub_groups)


def sub_group(labels: Mapping[str, Any]) -> str:
    """The leaf sub-group a pod names ("" when none)."""
    name = labels.get(SUB_GROUP_LABEL)
    return name if isinstance(name, str) else ""


def read_sub_gang(gang: Gang, name: str, pods: Iterable[Mapping[str, Any]] | None) -> Gang | None:
    """A sub-group of `gang` as a gang of its own: its minMember, and its members running among `pods` (the
    namespace's pods with its label; None: they could not be listed, and none of its members may be evicted). None
    when the PodGroup declares no such sub-group."""
    if name not in gang.sub_groups:
        return None
    running = None if pods is None else sum(1 for pod in pods if _running_member(pod, gang.name))
    return Gang(gang.namespace, f"{gang.name}/{name}", gang.sub_groups[name], running, sub=True)


def _running_member(pod: Mapping[str, Any], group: str) -> bool:
    metadata = pod.get("metadata") or {}
    return pod_group(metadata.get("annotations") or {}) == group and not metadata.get("deletionTimestamp") and \
        (pod.get("status") or {}).get("phase") == "Running"


def unknown_gang(namespace: str, name: str) -> Gang:
    """A PodGroup the API server did not answer for: all of its members are spared."""
    return Gang(namespace, name, 1, None)
