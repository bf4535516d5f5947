"""Workloads: the pod templates of the objects that make pods, judged when they are applied.

Pure. A Deployment with `gpu-fraction: "1.5"` is denied at `kubectl apply`, with the pod's denial prefixed by where
the template is (`spec.template: annotation gpu-fraction: ...`), rather than as a FailedCreate event on a
ReplicaSet later. Templates are never mutated: the pods they make are, on their CREATE, as any pod.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gpufrac.webhook.decide.errors import BadReviewError, Violation
from gpufrac.webhook.decide.policy import Policy
from gpufrac.webhook.decide.validation import validate_template


@dataclass(frozen=True)
class Workload:
    """A kind whose objects hold a pod template, and where."""

    kind: str
    group: str
    resource: str
    template_path: tuple[str, ...]

    @property
    def where(self) -> str:
        return ".".join(self.template_path)


WORKLOADS = (
    Workload("Deployment", "apps", "deployments", ("spec", "template")),
    Workload("StatefulSet", "apps", "statefulsets", ("spec", "template")),
    Workload("DaemonSet", "apps", "daemonsets", ("spec", "template")),
    Workload("ReplicaSet", "apps", "replicasets", ("spec", "template")),
    Workload("Job", "batch", "jobs", ("spec", "template")),
    Workload("CronJob", "batch", "cronjobs", ("spec", "jobTemplate", "spec", "template")),
    Workload("PodTemplate", "", "podtemplates", ("template",)),
)
BY_RESOURCE = {w.resource: w for w in WORKLOADS}
BY_KIND = {w.kind: w for w in WORKLOADS}


def pod_template(obj: dict[str, Any], workload: Workload) -> dict[str, Any] | None:
    """The template as a pod (its metadata and spec), or None where the object has none."""
    node: Any = obj
    walked = "object"
    for part in workload.template_path:
        if not isinstance(node, dict):
            raise BadReviewError(f"{walked} must be an object, got {type(node).__name__}")
        node = node.get(part)
        walked += f".{part}"
        if node is None:
            return None
    if not isinstance(node, dict):
        raise BadReviewError(f"{walked} must be an object, got {type(node).__name__}")
    return {"metadata": node.get("metadata") or {}, "spec": node.get("spec") or {}}


def validate_workload(obj: dict[str, Any], old: dict[str, Any] | None, workload: Workload,
                      policy: Policy) -> list[Violation]:
    """The pod rules on the template. An UPDATE that leaves the template as it was is not judged again: the
    controllers update their objects too (revisions, status), and a template from before gpufrac must not stop
    them; its pods are judged when they are created."""
    template = pod_template(obj, workload)
    if template is None or (old is not None and pod_template(old, workload) == template):
        return []
    return [replace(v, where=workload.where) for v in validate_template(template, policy)]
