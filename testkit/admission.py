"""The webhook's two decisions on a new pod, as the webhook tests assert them (denied by both, admitted by both and
left alone by KAI's admission), and the shorthand pods KAI's admission is compared on."""

from __future__ import annotations

from typing import Any

import jsonpatch

from gpufrac.webhook.decide import admission
from gpufrac.webhook.decide.policy import Policy
from testkit.kai_oracle import kai_mutate
from testkit.pods import NOTEBOOK
from testkit.reviews import review

BINDER = "system:serviceaccount:kai-scheduler:binder"
POLICY = Policy()
MULTIPLE = Policy(allow_multiple_fraction_containers=True)  # for a binder that binds every fractional container


def denial(obj: dict[str, Any], policy: Policy = POLICY) -> str:
    """The message both webhooks deny a new pod with (the mutating one first, as the user hears it)."""
    outcome = admission.mutate(review(obj), policy)
    assert not outcome.allowed, "expected a denial"
    assert outcome.patch == []
    again = admission.validate(review(obj), policy)
    assert not again.allowed, "the validating webhook must deny it too"
    return outcome.message


def allowed(obj: dict[str, Any], policy: Policy = POLICY) -> admission.Outcome:
    """The mutating webhook admits the new pod. With one fraction container (what KAI binds), KAI's admission
    running after gpufrac finds nothing to write and nothing to deny (testkit/kai_oracle.py)."""
    outcome = admission.mutate(review(obj), policy)
    assert outcome.allowed, outcome.message
    if policy is POLICY:
        kai_finds_nothing_to_do(jsonpatch.apply_patch(obj, outcome.patch))
    return outcome


def kai_finds_nothing_to_do(final: dict[str, Any]) -> None:
    written = {k: v for k, v in final["metadata"]["annotations"].items() if not k.startswith("gpufrac.io/")}
    names = [c["name"] for c in final["spec"]["containers"]]
    init = [c["name"] for c in final["spec"].get("initContainers", [])]
    assert kai_mutate(written, names, init) == written, "KAI's admission would change or deny this pod"


def created(obj: dict[str, Any], policy: Policy = POLICY) -> dict[str, Any]:
    """The pod as stored after both webhooks admitted its CREATE."""
    outcome = allowed(obj, policy)
    final: dict[str, Any] = jsonpatch.apply_patch(obj, outcome.patch)
    validated = admission.validate(review(final), policy)
    assert validated.allowed, validated.message
    return final


# Pods written with the pod-level shorthands, admitted: the coexistence test checks that gpufrac writes for each
# exactly what KAI's admission would (tests/webhook/test_kai_coexistence.py). (id, annotations, containers)
SHORTHAND_PODS: list[tuple[str, dict[str, str], tuple[str, ...]]] = [
    ("fraction", {"gpu-fraction": "0.5"}, ("main",)),
    ("fraction-signed", {"gpu-fraction": "+0.5"}, ("main",)),
    ("fraction-limit", {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.8"}, ("main",)),
    ("fraction-limit-5-digits", {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.80000"}, ("main",)),
    ("fraction-limit-helper", {"gpu-fraction": "0.25", "gpu-fraction.limit": "0.5",
                               "gpu-fraction-container-name": "helper"}, ("main", "helper")),
    ("memory-2000", {"gpu-memory": "2000"}, ("main",)),
    ("memory-2048", {"gpu-memory": "2048"}, ("main",)),
    ("memory-1024", {"gpu-memory": "1024"}, ("main",)),
    ("memory-1536", {"gpu-memory": "1536"}, ("main",)),
    ("memory-leading-zero", {"gpu-memory": "02048"}, ("main",)),
    ("memory-1TiB", {"gpu-memory": "1048576"}, ("main",)),
    ("memory-limit", {"gpu-memory": "4096", "gpu-memory.limit": "6Gi"}, ("main",)),
    ("memory-limit-exa", {"gpu-memory": "4096", "gpu-memory.limit": "1E"}, ("main",)),
    ("memory-limit-canonical-per-container", {"gpu-memory": "4096", "gpu-memory.limit": "8Gi",
                                              "nvidia.com/container.main.gpu-memory.request": "4Gi",
                                              "nvidia.com/container.main.gpu-memory.limit": "8Gi"}, ("main",)),
    ("memory-helper", {"gpu-memory": "2000", "gpu-fraction-container-name": "helper",
                       "nvidia.com/container.helper.gpu-memory.request": "2000Mi"}, ("main", "helper")),
    ("memory-keyed-helper", {"gpu-memory": "2000", "nvidia.com/container.helper.gpu-memory.request": "2000Mi"},
     ("main", "helper")),
    ("fraction-mode-helper", {"gpu-fraction": "0.5", "nvidia.com/container.helper.gpu-compute.mode": "sm-sharing"},
     ("main", "helper")),
    ("memory-devices", {"gpu-memory": "3072", "gpu-fraction-num-devices": "2"}, ("main",)),
    ("mode-shorthand", {"gpu-fraction": "0.5", "kai.scheduler/gpu-compute-sharing-mode": "sm-sharing"}, ("main",)),
    ("mode-shorthand-memory", {"gpu-memory": "8192", "kai.scheduler/gpu-compute-sharing-mode": "time-slicing",
                               "nvidia.com/container.main.gpu-compute.mode": "time-slicing"}, ("main",)),
    ("notebook-seed", dict(NOTEBOOK), ("app",)),
]
