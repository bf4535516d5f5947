"""What each phase's rules read: one context per phase, built once by the webhook and handed to every check of the
phase (`Rule.check`), as KAI's admission hands each plugin the pod.

Pure. `Values` for the value rules (`resolve`), `PodReview` for the rest of a pod's rules (`validation`),
`OwnRequest` for pods/status and a Binding.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufrac.webhook.decide.fractions.model import (
    ContainerFraction,
    ContainerKeys,
    ContainerRequest,
    Containers,
    PodFractions,
    PodRequest,
    Shorthands,
    Target,
)
from gpufrac.webhook.decide.policy import Policy, UserInfo


@dataclass(frozen=True)
class Values:
    """A pod's fraction annotations, read: what the value rules judge."""

    annotations: Mapping[str, str]  # the fraction annotations as written
    containers: Containers
    bound: bool  # absolute memory next to gpu-fraction is the scheduler's bind-time value (after CREATE)
    allow_multiple: bool  # several containers may each hold a fraction
    shorthands: Shorthands
    keys: dict[str, ContainerKeys]  # the per-container keys as written, by container
    target: Target
    request: PodRequest
    translation: ContainerKeys | None  # the target's keys for the shorthands
    translated: Mapping[str, str]  # the same, key -> value
    merged: Mapping[str, ContainerKeys]  # the keys on the target only where others are denied, with the translation
    requests: Mapping[str, ContainerRequest]  # each container's keys, read
    fractions: Mapping[str, ContainerFraction]  # the containers holding a fraction, in the pod's order


@dataclass(frozen=True)
class PodReview:
    """A pod being created (`old` None) or updated, with its fractions: what the rules after the values judge."""

    obj: dict[str, Any]
    old: dict[str, Any] | None
    user: UserInfo
    policy: Policy
    fractions: PodFractions
    old_fractions: Callable[[], PodFractions]  # the old pod's, read only when a rule asks (`resolve`, bound)
    template: bool = False  # a workload's pod template: nothing is injected into it yet


@dataclass(frozen=True)
class OwnRequest:
    """pods/status (the object and the pod before it) or a Binding (`old` None)."""

    obj: dict[str, Any]
    old: dict[str, Any] | None = None
