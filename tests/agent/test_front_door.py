"""One front door per GPU (decide.front_door): the node's choice from its label, and each door refusing a GPU the
other serves: the NRI plugin an annotated fraction on a DRA GPU, the DRA driver a claim on a GPU holding an annotated
fraction or on a node whose door is annotations."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpufrac.agent.decide.dra_claims import ClaimError
from gpufrac.agent.decide.front_door import FrontDoorChoice, choose, dra_served
from gpufrac.agent.decide.nri_decision import Injection, Refusal, RefusalReason, decide
from gpufrac.core.contract import FRONT_DOOR_LABEL, FrontDoor
from testkit.agent import UUID_A, UUID_B
from tests.agent.test_dra_decide import claim, node, prepared
from tests.agent.test_nri_decision import CDI_NODE, fractional

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


def test_the_nri_plugin_refuses_an_annotated_fraction_on_a_gpu_served_through_dra() -> None:
    pod, container = fractional(UUID_B)
    held = replace(CDI_NODE, dra_gpus={UUID_B: "ResourceClaim team/claim-1 is prepared on it"})
    result = decide(pod, container, held)
    assert isinstance(result, Refusal) and result.reason is RefusalReason.SERVED_THROUGH_DRA
    assert result.message.startswith("container app of pod team-a/infer is an annotated GPU fraction, but GPU "
                                     f"{UUID_B} is served through DRA (ResourceClaim team/claim-1")
    assert "gpufrac.io/front-door is annotations" in result.message
    # the same fraction on the other GPU, or with nothing served through DRA, is injected
    assert isinstance(decide(*fractional(UUID_A), held), Injection)
    assert isinstance(decide(pod, container, CDI_NODE), Injection)
    # whatever the entry's spelling: an index names the same GPU
    assert isinstance(decide(*fractional("1"), held), Refusal)


def test_the_driver_refuses_a_claim_on_an_annotations_node_and_on_a_gpu_holding_an_annotated_fraction() -> None:
    annotations_node = node(front_door=FrontDoorChoice(ANNOTATIONS, "node label gpufrac.io/front-door=annotations"))
    with pytest.raises(ClaimError, match=r"^node node-a hands its GPUs out through annotations \(node label "
                                         r"gpufrac.io/front-door=annotations\), not through DRA"):
        prepared(claim("gpu-0-time-slicing"), annotations_node)
    busy = node(annotated={"GPU-00000000-aaaa": "container app of pod team-a/infer"})
    with pytest.raises(ClaimError, match=r"GPU 0 \(GPU-00000000-aaaa\) is served through annotations \(container "
                                         r"app of pod team-a/infer is placed on it\)"):
        prepared(claim("gpu-0-sm-sharing", compute="50"), busy)
    assert prepared(claim("gpu-1-sm-sharing", compute="50"), busy).devices[0].gpu_index == 1
