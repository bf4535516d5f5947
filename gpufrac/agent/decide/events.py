"""Violations as Kubernetes Events on the pod, deduplicated across loops and agent restarts.

Each violation gets a deterministic Event name (pod name + hash of its identity), so emitting it again
(another loop, a restarted agent) hits AlreadyExists instead of adding a duplicate.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any, Protocol

from gpufrac.agent.decide.model import DaemonStatus, EnforcementViolation
from gpufrac.core.owners import Owner

COMPONENT = "gpufrac-agent"


def event_name(violation: EnforcementViolation) -> str:
    digest = hashlib.sha256("\0".join(violation.identity).encode()).hexdigest()[:16]
    return f"{violation.container.pod[:200]}.gpufrac-{digest}"


def _warning_event(node: str, metadata: dict[str, Any], involved: dict[str, Any], reason: str, message: str,
                   now: dt.datetime, event_type: str = "Warning") -> dict[str, Any]:
    """A Warning (or Normal) Event the agent on `node` reports."""
    stamp = now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": metadata,
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "type": event_type,
        "source": {"component": COMPONENT, "host": node},
        "reportingComponent": f"gpufrac.io/{COMPONENT}",
        "reportingInstance": node,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def event_body(violation: EnforcementViolation, node: str, now: dt.datetime) -> dict[str, Any]:
    c = violation.container
    involved = {"apiVersion": "v1", "kind": "Pod", "namespace": c.namespace, "name": c.pod, "uid": c.pod_uid}
    if not c.claim:  # a claim's share names no container of its pod
        involved["fieldPath"] = f"spec.containers{{{c.container}}}"
    return _warning_event(
        node,
        {"name": event_name(violation), "namespace": c.namespace,
         "labels": {"gpufrac.io/violation": str(violation.kind)}},
        involved,
        violation.kind.event_reason,
        violation.message[:1024],
        now,
    )


def pod_event(node: str, namespace: str, pod: str, pod_uid: str, reason: str, message: str, *,
              container: str | None = None, event_type: str = "Warning", labels: dict[str, str] | None = None,
              now: dt.datetime | None = None) -> dict[str, Any]:
    """An Event about one action on a pod (a reclaim, a killed process): a new one per action (generateName)."""
    involved = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod, "uid": pod_uid}
    if container is not None:
        involved["fieldPath"] = f"spec.containers{{{container}}}"
    return _warning_event(
        node,
        {"generateName": f"{pod[:200]}.gpufrac-", "namespace": namespace, "labels": labels or {}},
        involved, reason, message[:1024], now or dt.datetime.now(dt.UTC), event_type,
    )


def owner_event(node: str, namespace: str, owner: Owner, reason: str, message: str, *,
                labels: dict[str, str] | None = None, now: dt.datetime | None = None) -> dict[str, Any]:
    """An Event on a pod's controller, about what the agent did to one of its pods (`kubectl describe` shows it on
    the Deployment's ReplicaSet, the StatefulSet, the Job)."""
    involved = {"apiVersion": owner.api_version, "kind": owner.kind, "namespace": namespace, "name": owner.name,
                "uid": owner.uid}
    return _warning_event(
        node,
        {"generateName": f"{owner.name[:200]}.gpufrac-", "namespace": namespace, "labels": labels or {}},
        involved, reason, message[:1024], now or dt.datetime.now(dt.UTC),
    )


class EventSink(Protocol):
    def create_event(self, namespace: str, body: dict[str, Any]) -> bool:
        """True when created, False when an Event of that name already exists."""
        ...


class ViolationRecorder:
    """Emits each violation once; returns only the ones new to the cluster."""

    def __init__(self, sink: EventSink, node: str) -> None:
        self._sink = sink
        self._node = node
        self._emitted: set[tuple[str, ...]] = set()

    def record(self, violations: list[EnforcementViolation],
               now: dt.datetime | None = None) -> list[EnforcementViolation]:
        new = []
        for violation in violations:
            if violation.identity in self._emitted:
                continue
            created = self._sink.create_event(
                violation.container.namespace,
                event_body(violation, self._node, now or dt.datetime.now(dt.UTC)),
            )
            self._emitted.add(violation.identity)
            if created:
                new.append(violation)
        return new

    def forget_pods(self, live_pod_uids: set[str]) -> None:
        """Drop memory of pods that are gone (their Events stay in the cluster until they expire)."""
        self._emitted = {i for i in self._emitted if i[3] in live_pod_uids}


def daemon_restart_event(node: str, status: DaemonStatus, now: dt.datetime | None = None) -> dict[str, Any]:
    """A Warning Event on the Node for one restart of a mode's MPS control daemon (one per restart seen)."""
    how = status.last_exit or "exited"
    return _warning_event(
        node,
        {"generateName": f"{node[:200]}.gpufrac-mps-{status.mode}-", "namespace": "default",
         "labels": {"gpufrac.io/mps-daemon": str(status.mode)}},
        {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "MpsDaemonRestarted",
        f"the {status.mode} MPS control daemon {how} and was restarted (restart {status.restarts}); "
        f"{status.mode} fractions on this node wait while it is down",
        now or dt.datetime.now(dt.UTC),
    )


def refusal_event(node: str, namespace: str, pod: str, pod_uid: str, container: str, reason: str, message: str,
                  now: dt.datetime | None = None, label: str = "gpufrac.io/refused") -> dict[str, Any]:
    """A Warning Event on the pod for a container the NRI plugin refused at creation, beside the runtime's error.

    Named by pod, container and reason: the kubelet retries the creation with backoff, and each retry's refusal
    finds the Event already there instead of adding one."""
    digest = hashlib.sha256("\0".join((pod_uid, container, reason)).encode()).hexdigest()[:16]
    return _warning_event(
        node,
        {"name": f"{pod[:200]}.gpufrac-nri-{digest}", "namespace": namespace,
         "labels": {label: reason}},
        {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod, "uid": pod_uid,
         "fieldPath": f"spec.containers{{{container}}}"},
        reason,
        message[:1024],
        now or dt.datetime.now(dt.UTC),
    )


def pod_notice_event(node: str, namespace: str, pod: str, pod_uid: str, reason: str, message: str, *,
                     label: str, now: dt.datetime | None = None) -> dict[str, Any]:
    """A Warning Event on a pod about the pod as a whole, named by its UID and the reason: every agent that finds
    the same thing makes the same Event, so the cluster gets it once (the others' create is AlreadyExists)."""
    digest = hashlib.sha256("\0".join((pod_uid, reason)).encode()).hexdigest()[:16]
    return _warning_event(
        node,
        {"name": f"{pod[:200]}.gpufrac-{digest}", "namespace": namespace, "labels": {label: reason}},
        {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod, "uid": pod_uid},
        reason,
        message[:1024],
        now or dt.datetime.now(dt.UTC),
    )
