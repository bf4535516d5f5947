"""The front doors over the node core: what a door is to the agent (`FrontDoor`), what it may read of the node
(`NodeView`), and the doors together (`Doors`), as the agent's tick and the other doors ask them.

A door (agent/nri, agent/dra, agent/csi) is built by the agent with its read-only view of the node, and knows no
other door: what one door holds that another must respect (the GPUs DRA serves, the pods that hold a time-slicing
claim) goes through `Doors`, in the core's own types (decide.claim_tenants, decide.claim_holders).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpufrac.agent.decide.claim_holders import ClaimHolder
from gpufrac.agent.decide.claim_tenants import NO_CLAIMS, ClaimTenants, joined
from gpufrac.agent.decide.model import DaemonStatus, Inventory, RunningContainer
from gpufrac.agent.node.agent_config import AgentConfig
from gpufrac.core.annotations import ComputeMode

Found = tuple[str, str]  # (reason, message), said on the node's condition
Check = Callable[[], "Found | None"]
Watch = Callable[["NodeView"], None]  # run at each tick, after the node's condition, with the agent's view


@dataclass(frozen=True)
class NodeChecks:
    """Checks of the node's own beside the doors': what makes it not Ready (KAI's gpu-fractioning operator here: the
    agent stands down, and publishes its own condition only), remarks said on a Ready one (a webhook of another
    minor version), and watches that tell the cluster what the node sees (fractions no node can place)."""

    blockers: tuple[Check, ...] = ()
    remarks: tuple[Check, ...] = ()
    watches: tuple[Watch, ...] = ()
    standing_down: Callable[[], bool] = lambda: False


NO_CHECKS = NodeChecks()


@dataclass(frozen=True)
class DoorReport:
    """What a door tells the node's condition at each tick."""

    delivery: str | None = None  # why fractions get no GPU through it (NriUnavailable: the NRI plugin is not serving)
    runtime: tuple[Found, ...] = ()  # the delivery path's problems (containerd < 2.1, a GPU without a CDI spec)
    problem: str | None = None  # said on the condition, not blocking (the DRA door: its front-door label, its CDI dir)
    blocking: tuple[Found, ...] = ()  # what makes the node not Ready (no NRI without the env fallback)


class NodeView(Protocol):
    """The node core as a door reads it (the agent: node.node_loop.Agent). Read-only, but for `hold_now`, which
    tells the sm-sharing daemon a fraction's limits before its creation is answered."""

    @property
    def config(self) -> AgentConfig: ...

    @property
    def inventory(self) -> Inventory | None: ...

    @property
    def not_served(self) -> Mapping[ComputeMode, str | None]: ...  # per mode, why not now, as of the last tick

    @property
    def ticked(self) -> threading.Event: ...  # the first tick has run

    def pods_synced(self) -> bool: ...

    def pod_fractions(self) -> list[RunningContainer]: ...  # the fractions of the node's pods, annotated

    def placed(self) -> list[RunningContainer]: ...  # every fraction on the node: the pods' and the doors' tenants

    def find_pod(self, namespace: str, name: str, uid: str) -> dict[str, Any] | None: ...

    def daemon_statuses(self) -> dict[ComputeMode, DaemonStatus]: ...

    def serving_now(self) -> dict[ComputeMode, str | None]: ...  # per mode, why not now, from one fresh reading

    def usable_mib(self) -> dict[str, int]: ...  # per GPU model, as the last audit measured

    def guarantee_labels(self) -> dict[str, str]: ...

    def door_gpus(self) -> dict[str, str]: ...  # GPU UUID -> why a door holds it: annotated fractions refused there

    def claim_holders(self) -> dict[str, ClaimHolder]: ...

    def hold_now(self, created_pod: Mapping[str, Any] | None = None, within_s: float | None = None) -> str | None: ...

    def pipe_route(self, pod_uid: str, container: str) -> Path | None: ...  # an sm-sharing fraction's MPS namespace


class FrontDoor(Protocol):
    """A way fractions reach containers (the NRI plugin, the DRA driver, the CSI plugin)."""

    def tenants(self) -> ClaimTenants: ...  # the fractions it placed that no pod annotation says (DRA claims)

    def held_gpus(self) -> Mapping[str, str]: ...  # GPU UUID -> why: other doors refuse annotated fractions there

    def claim_holders(self) -> Mapping[str, ClaimHolder]: ...  # time-slicing claim UID -> the pod it serves

    def report(self) -> DoorReport: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


DoorFactory = Callable[[NodeView], FrontDoor]


class HoldsNothing:
    """A door's answers where it places no tenant, holds no GPU and serves no claim (the NRI and CSI doors: an
    annotated fraction is its pod's, which the core reads itself)."""

    def tenants(self) -> ClaimTenants:
        return NO_CLAIMS

    def held_gpus(self) -> dict[str, str]:
        return {}

    def claim_holders(self) -> dict[str, ClaimHolder]:
        return {}

    def report(self) -> DoorReport:
        return DoorReport()


class Doors:
    """The agent's doors, in the order they start (they stop in the reverse order)."""

    def __init__(self, doors: Sequence[FrontDoor]) -> None:
        self.all = tuple(doors)

    def tenants(self) -> ClaimTenants:
        return joined(door.tenants() for door in self.all)

    def held_gpus(self) -> dict[str, str]:
        return {gpu: why for door in self.all for gpu, why in door.held_gpus().items()}

    def claim_holders(self) -> dict[str, ClaimHolder]:
        return {claim: holder for door in self.all for claim, holder in door.claim_holders().items()}

    def report(self) -> DoorReport:
        reports = [door.report() for door in self.all]
        return DoorReport(
            delivery=_joined(r.delivery for r in reports),
            runtime=tuple(found for r in reports for found in r.runtime),
            problem=_joined(r.problem for r in reports),
            blocking=tuple(found for r in reports for found in r.blocking),
        )

    def start(self) -> None:
        for door in self.all:
            door.start()

    def stop(self) -> None:
        for door in reversed(self.all):
            door.stop()


def _joined(problems: Any) -> str | None:
    return "; ".join(p for p in problems if p) or None
