"""The AdmissionReviews the bench sends: the seed pods as the API server hands them to a webhook (defaults and
the ServiceAccount token volume filled in), and synthetic pods of a chosen size.

The pods and reviews are the test kit's (testkit.pods, testkit.reviews), with the fields the API server adds.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import jsonpatch

from gpufrac.core.contract import DEFAULT_SCHEDULER_USER
from gpufrac.webhook.decide import admission
from gpufrac.webhook.decide.policy import Policy
from gpufrac.webhook.decide.review import parse_review
from testkit import pods
from testkit.pods import INFERENCE, NOTEBOOK, as_admitted
from testkit.reviews import review_body

BINDER = DEFAULT_SCHEDULER_USER
DEVICES = ("GPU-4a2e1f6c-8b1d-4c55-9f0e-1a2b3c4d5e6f", "GPU-7c9d0e1f-2a3b-4c5d-8e9f-a0b1c2d3e4f5")

# The seed pods (testkit.pods, from examples/): the 4-GPU sm-sharing inference pod (absolute memory: fully mutated
# at CREATE) and the time-slicing notebook (a portion of two GPUs, turned into MiB when the scheduler binds it).
# What KAI's binder writes at bind for the notebook (0.5 and 0.8 of an H200's 143771 MiB).
BIND_ANNOTATIONS = {
    "nvidia.com/container.app.gpus.devices": ",".join(DEVICES),
    "nvidia.com/container.app.gpu-memory.request": "71885Mi",
    "nvidia.com/container.app.gpu-memory.limit": "115016Mi",
}


def pod(name: str, annotations: dict[str, str], containers: int = 1) -> dict[str, Any]:
    """A pod as a mutating webhook receives it on CREATE (after ServiceAccount admission and defaulting)."""
    names = ["app"] + [f"c{i}" for i in range(1, containers)]
    return as_admitted(pods.pod(annotations, *names, name=name, labels={"kai.scheduler/queue": "default-queue"},
                                spec={"schedulerName": "kai-scheduler"}, command=["sleep", "infinity"]))


def review(obj: dict[str, Any], *, operation: str = "CREATE", old: dict[str, Any] | None = None,
           user: str = "alice", groups: tuple[str, ...] = ("system:authenticated",),
           uid: str = "8f7c2a10-0000-4000-8000-000000000001") -> dict[str, Any]:
    """The review as the API server sends it, with every field gpufrac does not read."""
    meta = obj["metadata"]
    return review_body(obj, operation=operation, old=old, user=user, groups=groups, uid=uid, name=meta["name"],
                       namespace=meta["namespace"], as_sent=True)


def mutated(body: dict[str, Any], policy: Policy) -> dict[str, Any]:
    """The object after our mutating webhook's patch (what the validating webhook and etcd see)."""
    request = parse_review(body)
    outcome = admission.mutate(request, policy)
    if not outcome.allowed:
        raise RuntimeError(f"bench review denied by mutate: {outcome.message}")
    return jsonpatch.apply_patch(request.obj, outcome.patch)


@dataclass(frozen=True)
class SeedReview:
    name: str  # short label for tables
    path: str  # /mutate or /validate
    body: dict[str, Any]

    @cached_property
    def raw(self) -> bytes:
        return json.dumps(self.body, separators=(",", ":")).encode()


# A pod CREATE costs the webhook these two reviews: the API server calls /mutate, then /validate on the result.
INFERENCE_MUTATE = "inference CREATE /mutate"
INFERENCE_VALIDATE = "inference CREATE /validate"
POD_CREATE = (INFERENCE_MUTATE, INFERENCE_VALIDATE)


def seed_reviews(policy: Policy) -> list[SeedReview]:
    """The reviews of the brief (the inference pod's CREATE through both webhooks, the notebook's CREATE, the
    binder's UPDATE), each checked to be allowed (and the mutating ones to patch)."""
    inference = review(pod("inference", INFERENCE))
    inference_mutated = review(mutated(inference, policy))  # what the validating webhook sees of the same CREATE
    notebook_create = review(pod("notebook", NOTEBOOK))
    notebook = mutated(notebook_create, policy)  # as stored by the API server after CREATE
    notebook = copy.deepcopy(notebook)
    notebook["metadata"].update(uid="3b1f7f0e-5c1a-4f43-9d1e-2f6a7b8c9d0e", resourceVersion="4711",
                                creationTimestamp="2026-11-29T12:00:00Z")
    bound = copy.deepcopy(notebook)
    bound["metadata"]["annotations"].update(BIND_ANNOTATIONS)
    bound["spec"]["nodeName"] = "gpu-node-1"
    groups = ("system:serviceaccounts", "system:serviceaccounts:kai-scheduler", "system:authenticated")
    bind = review(bound, operation="UPDATE", old=notebook, user=BINDER, groups=groups)
    reviews = [
        SeedReview(INFERENCE_MUTATE, "/mutate", inference),
        SeedReview(INFERENCE_VALIDATE, "/validate", inference_mutated),
        SeedReview("notebook CREATE /validate", "/validate", review(notebook)),
        SeedReview("binder UPDATE /mutate", "/mutate", bind),
        # What the validating webhook sees of the same bind: the canonical memory written, the old pod beside it.
        SeedReview("binder UPDATE /validate", "/validate",
                   review(mutated(bind, policy), operation="UPDATE", old=notebook, user=BINDER, groups=groups)),
    ]
    for r in reviews:
        request = parse_review(r.body)
        outcome = (admission.mutate if r.path == "/mutate" else admission.validate)(request, policy)
        if not outcome.allowed or (r.path == "/mutate" and not outcome.patch):
            raise RuntimeError(f"seed review {r.name!r} is not allowed-and-patched: {outcome.message}")
    return reviews


def sized_annotations(containers: int, annotations: int) -> tuple[dict[str, str], int]:
    """`annotations` annotations for a pod with `containers` containers, and how many containers are fractional.

    1 annotation: `gpu-fraction: 0.5` (the first container). More: a memory request and limit per container, in
    order, while they fit; the rest are unrelated annotations (other tools', which the webhook must skip).
    """
    if annotations == 1:
        return {"gpu-fraction": "0.5"}, 1
    result: dict[str, str] = {}
    names = ["app"] + [f"c{i}" for i in range(1, containers)]
    fractional = 0
    for name in names:
        if len(result) + 2 > annotations:
            break
        result[f"nvidia.com/container.{name}.gpu-memory.request"] = "4Gi"
        result[f"nvidia.com/container.{name}.gpu-memory.limit"] = "8Gi"
        fractional += 1
    i = 0
    while len(result) < annotations:
        result[f"team.example.com/note-{i}"] = f"value {i}"
        i += 1
    return result, fractional


def maximum_size_reviews(limit: int, policy: Policy) -> list[SeedReview]:
    """Two allowed /validate reviews just under the body limit `limit`: an UPDATE whose object and oldObject are
    each half of it. "annotation": the bulk in one unrelated annotation (a last-applied-configuration: few, long
    strings, the common way a pod gets big); "env": the bulk in env entries of a second container (many small
    objects: the most memory a body of this size takes once decoded, about 8 times its size)."""
    out = []
    base = mutated(review(pod("big", {"gpu-fraction": "0.5"}, containers=2)), policy)  # as stored after CREATE
    for shape in ("annotation", "env"):
        obj = copy.deepcopy(base)
        if shape == "annotation":
            obj["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = ""
        else:
            obj["spec"]["containers"][1]["env"] = []
        size = len(json.dumps(review(obj, operation="UPDATE", old=obj), separators=(",", ":")))
        room = (limit - size - 4096) // 2  # per object
        if shape == "annotation":
            obj["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "x" * room
        else:
            entry = len(json.dumps({"name": "ENV_000000", "value": "value-000000"}, separators=(",", ":"))) + 1
            obj["spec"]["containers"][1]["env"] = [{"name": f"ENV_{i:06d}", "value": f"value-{i:06d}"}
                                                   for i in range(room // entry)]
        body = review(obj, operation="UPDATE", old=copy.deepcopy(obj))
        size = len(json.dumps(body, separators=(",", ":")))
        out.append(SeedReview(f"{size / 2**20:.1f} MiB UPDATE /validate ({shape})", "/validate", body))
    for r in out:
        outcome = admission.validate(parse_review(r.body), policy)
        if not outcome.allowed or len(r.raw) > limit:
            raise RuntimeError(f"maximum-size review {r.name!r} is not allowed or too big: {outcome.message}")
    return out
