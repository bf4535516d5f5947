"""The one builder of pods and of the workloads that hold pod templates, for tests, e2e and bench: each caller says
only what its case is about (annotations, containers, where the pod runs) and the rest is the same everywhere.

The seed pods' annotations come from examples/ (the README's pods live there once); what the API server adds to a
pod before admission, and the status of a running pod, are data under testkit/data/.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpufrac.webhook.decide.workloads import BY_KIND
from testkit import REPO_ROOT

IMAGE = "nvcr.io/nvidia/cuda:13.0.2-base-ubuntu24.04"
INIT_IMAGE = "busybox"
NAMESPACE = "team-a"
NODE = "gpu-node-1"
EXAMPLES = REPO_ROOT / "examples"
DATA = Path(__file__).resolve().parent / "data"

Container = str | Mapping[str, Any]


def container(name: str = "app", image: str = IMAGE, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": image, **copy.deepcopy(fields)}


def _containers(given: Sequence[Container], image: str, fields: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [container(c, image, **fields) if isinstance(c, str) else copy.deepcopy(dict(c)) for c in given]


def pod(annotations: Mapping[str, str] | None = None, *containers: Container, name: str = "p",
        namespace: str = NAMESPACE, labels: Mapping[str, str] | None = None, init: Sequence[Container] = (),
        spec: Mapping[str, Any] | None = None, **container_fields: Any) -> dict[str, Any]:
    """A pod with these annotations and containers (names get the CUDA image and `container_fields`; dicts are
    taken as written; default: one named `app`), init containers (names get busybox) and other spec fields."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "annotations": dict(annotations or {})}
    if labels is not None:
        metadata["labels"] = dict(labels)
    body: dict[str, Any] = {"containers": _containers(containers or ("app",), IMAGE, container_fields)}
    if init:
        body["initContainers"] = _containers(init, INIT_IMAGE, {})
    body.update(copy.deepcopy(dict(spec or {})))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


def running_pod(name: str, *, uid: str, containers: Mapping[str, str], annotations: Mapping[str, str],
                namespace: str = NAMESPACE, node: str = NODE, running: bool = True, runtime: str = "containerd",
                labels: Mapping[str, str] | None = None, resource_version: str = "1") -> dict[str, Any]:
    """A pod as the API returns it once bound to `node`; `containers` maps names to their container IDs."""
    obj = pod(annotations, *containers, name=name, namespace=namespace, labels=labels, spec={"nodeName": node})
    obj["metadata"].update(uid=uid, resourceVersion=resource_version)
    statuses = [{"name": n, "containerID": f"{runtime}://{cid}", "ready": running,
                 "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}} if running else
                 {"waiting": {"reason": "ContainerCreating"}}} for n, cid in containers.items()]
    obj["status"] = {"phase": "Running" if running else "Pending", "containerStatuses": statuses}
    return obj


def as_admitted(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod as a mutating webhook receives its CREATE: what ServiceAccount admission and defaulting add
    (testkit/data/admitted-pod.yaml) under what the pod says."""
    defaults = yaml.safe_load((DATA / "admitted-pod.yaml").read_text())
    out = copy.deepcopy(obj)
    out["metadata"] = {**defaults["metadata"], **out["metadata"]}
    out["spec"] = {**defaults["spec"], **out["spec"]}
    out["spec"]["containers"] = [{**defaults["container"], **c} for c in out["spec"]["containers"]]
    out.setdefault("status", defaults["status"])
    return out


def workload(kind: str, annotations: Mapping[str, str] | None = None, *containers: Container, name: str = "w",
             namespace: str = NAMESPACE, template_labels: Mapping[str, str] | None = None,
             **container_fields: Any) -> dict[str, Any]:
    """A Deployment, Job, CronJob, ... (any kind the webhook judges) whose pod template is `pod(...)`'s."""
    kind_of = BY_KIND[kind]
    template = pod(annotations, *containers, labels=template_labels, **container_fields)
    del template["metadata"]["name"], template["metadata"]["namespace"]
    obj: dict[str, Any] = {"apiVersion": f"{kind_of.group}/v1" if kind_of.group else "v1", "kind": kind,
                           "metadata": {"name": name, "namespace": namespace}}
    node = obj
    for part in kind_of.template_path[:-1]:
        node = node.setdefault(part, {})
    node[kind_of.template_path[-1]] = {"metadata": template["metadata"], "spec": template["spec"]}
    return obj


def pod_template(obj: dict[str, Any]) -> dict[str, Any]:
    """Where a workload built here keeps its pod template."""
    node = obj
    for part in BY_KIND[obj["kind"]].template_path:
        node = node[part]
    return node


def example(filename: str, name: str | None = None, namespace: str | None = None) -> dict[str, Any]:
    """A manifest of examples/, optionally renamed and moved."""
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / filename).read_text())
    if name:
        doc["metadata"]["name"] = name
    if namespace:
        doc["metadata"]["namespace"] = namespace
    return doc


def example_annotations(filename: str) -> dict[str, str]:
    """The annotations of a manifest in examples/ (the seed pods live there, once)."""
    annotations: dict[str, str] = example(filename)["metadata"]["annotations"]
    return annotations


INFERENCE = example_annotations("inference-sm-sharing.yaml")  # the 4-GPU sm-sharing inference server
NOTEBOOK = example_annotations("notebook-time-slicing.yaml")  # the 2-GPU time-slicing notebook
