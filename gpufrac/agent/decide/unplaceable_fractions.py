"""Fractions no node can place: a fraction whose pod names no compute mode is time-slicing (KAI's default, and
gpufrac's where the chart's `webhook.defaultMode` is unset), and time-slicing is enforced only with the driver's
memory limits (r615+). Where no node of the cluster has them (EKS AL2023's 580, the GPU Operator's 580/595), such a
pod's node affinity (gpufrac.io/enforcement.time-slicing In driver, mps) matches no node, and it would wait for ever
with nothing saying why. The agents of those nodes put one Warning Event on it naming why and the fix. Pure."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufrac.agent.decide.capabilities import DRIVER_MAJOR_LABEL, MIN_DRIVER_MAJOR
from gpufrac.agent.decide.events import pod_notice_event
from gpufrac.core.annotations import (
    CANONICAL_PREFIX,
    COMPUTE_MODE,
    CanonicalField,
    ComputeMode,
    Field,
    names_a_mode,
    nvidia_key,
)
from gpufrac.core.contract import ENFORCING, enforcement_label

NO_NODE_SERVES_TIME_SLICING = "NoNodeServesTimeSlicing"
EVENT_LABEL = "gpufrac.io/unplaceable"
_MODE_SUFFIX = f".{CanonicalField.COMPUTE_MODE}"


@dataclass(frozen=True)
class Unplaceable:
    """A pod no node can place, and its containers that are time-slicing only because it names no mode."""

    namespace: str
    name: str
    uid: str
    containers: tuple[str, ...]


def serves_time_slicing(node_labels: Mapping[str, str]) -> bool:
    """What a time-slicing fraction's node affinity requires of a node (the webhook's requireEnforcingNode)."""
    return node_labels.get(enforcement_label(ComputeMode.TIME_SLICING)) in {str(e) for e in ENFORCING}


def defaulted_time_slicing(pod: Mapping[str, Any]) -> Unplaceable | None:
    """The pod, where it is not bound, not being deleted, names no compute mode in its own annotations, and the
    webhook made some container of it time-slicing (its canonical compute-mode); None otherwise."""
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    if (pod.get("spec") or {}).get("nodeName") or metadata.get("deletionTimestamp") or names_a_mode(annotations):
        return None
    containers = tuple(sorted(
        key[len(CANONICAL_PREFIX):-len(_MODE_SUFFIX)] for key, value in annotations.items()
        if key.startswith(CANONICAL_PREFIX) and key.endswith(_MODE_SUFFIX) and value == ComputeMode.TIME_SLICING))
    if not containers:
        return None
    return Unplaceable(str(metadata.get("namespace", "")), str(metadata.get("name", "")), str(metadata.get("uid", "")),
                       containers)


def unplaceable(pods: Iterable[Mapping[str, Any]], nodes: Sequence[Mapping[str, str]]) -> list[Unplaceable]:
    """The pods that wait for a time-slicing node only because they name no mode, where no node (`nodes`: their
    labels) serves time-slicing; none where one does (they wait for room there, not for ever)."""
    if any(serves_time_slicing(labels) for labels in nodes):
        return []
    return [found for pod in pods if (found := defaulted_time_slicing(pod)) is not None]


def drivers(nodes: Sequence[Mapping[str, str]], own_driver: str) -> list[str]:
    """The driver versions the GPU nodes run, as their labels say (majors), this node's own in full."""
    majors = {labels[DRIVER_MAJOR_LABEL] for labels in nodes if labels.get(DRIVER_MAJOR_LABEL)}
    own_major = own_driver.split(".")[0]
    return sorted({own_driver, *(m for m in majors if m != own_major)})


def message(pod: Unplaceable, node_drivers: Collection[str]) -> str:
    per_container = ", ".join(f"{nvidia_key(c, Field.COMPUTE_MODE)}: sm-sharing" for c in pod.containers)
    return (f"this pod names no compute mode, so its fraction is time-slicing (KAI's default), and no node of the "
            f"cluster serves time-slicing: the GPU nodes' drivers ({', '.join(node_drivers)}) have no memory limits "
            f"for it (r{MIN_DRIVER_MAJOR}+ needed), so its node affinity "
            f"({enforcement_label(ComputeMode.TIME_SLICING)} In driver, mps) matches no node and it waits for ever; "
            f"ask for sm-sharing (enforced with MPS on these drivers): annotate the pod "
            f"{COMPUTE_MODE}: sm-sharing (or {per_container}), or set the chart's webhook.defaultMode=sm-sharing "
            f"for every fraction that names no mode; or upgrade the GPU nodes' driver to r{MIN_DRIVER_MAJOR}+")


def unplaceable_event(node: str, pod: Unplaceable, node_drivers: Collection[str],
                      now: dt.datetime | None = None) -> dict[str, Any]:
    """The Warning Event on the pod, named by its UID: the agents of every such node make the same one."""
    return pod_notice_event(node, pod.namespace, pod.name, pod.uid, NO_NODE_SERVES_TIME_SLICING,
                            message(pod, node_drivers), label=EVENT_LABEL, now=now)
