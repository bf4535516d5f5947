"""One front door per GPU (decide.front_door): the node's choice from its label, and which GPUs DRA serves. Each
door's refusal of a GPU the other serves is tested with its decision: test_nri_decision, test_dra_decide."""

from __future__ import annotations

import pytest

from gpufrac.agent.decide.front_door import choose, dra_served
from gpufrac.core.contract import FRONT_DOOR_LABEL, FrontDoor
from testkit.agent import UUID_A, UUID_B

DRA = FrontDoor.DRA
ANNOTATIONS = FrontDoor.ANNOTATIONS


@pytest.mark.parametrize(("labels", "enabled", "default", "door", "problem"), [
    ({}, True, DRA, DRA, None),
    ({}, True, ANNOTATIONS, ANNOTATIONS, None),
    ({FRONT_DOOR_LABEL: "annotations"}, True, DRA, ANNOTATIONS, None),
    ({FRONT_DOOR_LABEL: "dra"}, True, ANNOTATIONS, DRA, None),
    ({FRONT_DOOR_LABEL: "DRA"}, True, ANNOTATIONS, ANNOTATIONS, "is neither annotations nor dra"),
    ({FRONT_DOOR_LABEL: "dra"}, False, DRA, ANNOTATIONS, "runs without its DRA driver"),
    ({}, False, DRA, ANNOTATIONS, None),
], ids=["default-dra", "default-annotations", "label-annotations", "label-dra", "label-unknown", "dra-off",
        "dra-off-unlabelled"])
def test_the_node_label_chooses_the_door_and_a_value_it_cannot_follow_is_said(
        labels: dict[str, str], enabled: bool, default: FrontDoor, door: FrontDoor, problem: str | None) -> None:
    choice = choose(labels, enabled, default)
    assert choice.door is door
    if problem is None:
        assert choice.problem is None
    else:
        assert choice.problem is not None and problem in choice.problem


def test_a_dra_node_serves_every_gpu_and_a_prepared_claim_keeps_its_gpu_after_a_move() -> None:
    on_dra = dra_served(choose({}, True, DRA), [UUID_A, UUID_B], {})
    assert set(on_dra) == {UUID_A, UUID_B} and "front door is DRA" in on_dra[UUID_A]
    moved = dra_served(choose({FRONT_DOOR_LABEL: "annotations"}, True, DRA), [UUID_A, UUID_B],
                       {UUID_B: "team/claim-1"})
    assert moved == {UUID_B: "ResourceClaim team/claim-1 is prepared on it"}
