"""Which front door a node's GPUs have: annotated fractions or DRA claims, never both on one GPU. Pure.

The operator chooses per node with the label `gpufrac.io/front-door` (`dra` or `annotations`); a node without it gets
the chart's default (`dra.defaultFrontDoor`). A GPU is served through DRA while its node's door is DRA, and also
while a claim prepared before a move to annotations still holds it; it is served through annotations while an
annotated fraction is placed on it. Each door refuses a GPU the other one serves (the NRI plugin at creation, the
DRA driver at Prepare), so moving a node (docs/dra.md) waits for the other door's pods to go.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpufrac.core.contract import FRONT_DOOR_LABEL, FrontDoor

DRA_OFF = "the agent runs without its DRA driver (chart dra.enabled false)"


@dataclass(frozen=True)
class FrontDoorChoice:
    door: FrontDoor
    why: str  # for messages: where the choice comes from
    problem: str | None = None  # the label's value could not be followed (for the node condition)


def choose(labels: Mapping[str, str], dra_enabled: bool, default: FrontDoor) -> FrontDoorChoice:
    """The node's door from its labels: the label where valid, else the default; annotations without a DRA driver."""
    value = labels.get(FRONT_DOOR_LABEL)
    if not dra_enabled:
        problem = (f"node label {FRONT_DOOR_LABEL}={value} asks for DRA but {DRA_OFF}: its GPUs are handed out "
                   "through annotations") if value == FrontDoor.DRA else None
        return FrontDoorChoice(FrontDoor.ANNOTATIONS, DRA_OFF, problem)
    if value is None:
        return FrontDoorChoice(default, f"the default front door ({default}; node label {FRONT_DOOR_LABEL} unset)")
    try:
        door = FrontDoor(value)
    except ValueError:
        accepted = " nor ".join(door.value for door in FrontDoor)
        return FrontDoorChoice(default, f"the default front door ({default})",
                               f"node label {FRONT_DOOR_LABEL}={value!r} is neither {accepted}: the default "
                               f"{default} is used")
    return FrontDoorChoice(door, f"node label {FRONT_DOOR_LABEL}={door}")


def dra_served(choice: FrontDoorChoice, gpus: Iterable[str], claimed: Mapping[str, str]) -> dict[str, str]:
    """GPU UUID -> why it is served through DRA: every GPU of a DRA node, and any GPU a prepared claim holds
    (`claimed`: UUID -> the claim)."""
    served = {uuid: f"its node's front door is DRA ({choice.why})" for uuid in gpus} \
        if choice.door is FrontDoor.DRA else {}
    for uuid, claim in claimed.items():
        served.setdefault(uuid, f"ResourceClaim {claim} is prepared on it")
    return served


def refusal_for_annotated(where: str, gpu: str, why: str) -> str:
    """The NRI plugin's message for an annotated fraction on a GPU served through DRA."""
    return (f"{where} is an annotated GPU fraction, but GPU {gpu} is served through DRA ({why}): one front door per "
            f"GPU; ask for it with a ResourceClaim of the gpu.gpufrac.io DeviceClasses (docs/dra.md), or run the pod "
            f"on a node whose {FRONT_DOOR_LABEL} is {FrontDoor.ANNOTATIONS}")


def refusal_for_claim(gpu: str, why: str) -> str:
    """The DRA driver's message for a claim on a GPU served through annotations."""
    return (f"GPU {gpu} is served through annotations ({why}): one front door per GPU; the claim is prepared once "
            f"that is over (label the node {FRONT_DOOR_LABEL}={FrontDoor.DRA} and let its annotated fractions end)")
