"""The agent by front door (issue 46): the agent is built with its doors and checks, reads them through `Doors`, and
takes no late-bound slot from outside."""

from __future__ import annotations

from typing import Any

import pytest

from gpufrac.agent.decide.claim_holders import ClaimHolder
from gpufrac.agent.decide.claim_tenants import NO_CLAIMS, ClaimTenants
from gpufrac.agent.node.doors import DoorReport, Doors, HoldsNothing, NodeView
from testkit.agent import UUID_A, UUID_B, FakeNode, container, placing

QUIET = DoorReport()


class Door(HoldsNothing):
    def __init__(self, name: str, log: list[str], *, gpus: dict[str, str] | None = None,
                 holders: dict[str, ClaimHolder] | None = None, tenants: ClaimTenants = NO_CLAIMS,
                 report: DoorReport = QUIET) -> None:
        self.name, self.log, self._gpus, self._holders = name, log, gpus or {}, holders or {}
        self._tenants, self._report = tenants, report

    def tenants(self) -> ClaimTenants:
        return self._tenants

    def held_gpus(self) -> dict[str, str]:
        return self._gpus

    def claim_holders(self) -> dict[str, ClaimHolder]:
        return self._holders

    def report(self) -> DoorReport:
        return self._report

    def start(self) -> None:
        self.log.append(f"start {self.name}")

    def stop(self) -> None:
        self.log.append(f"stop {self.name}")


def test_the_doors_answer_together_and_stop_in_the_reverse_order() -> None:
    log: list[str] = []
    holder = ClaimHolder("team-a/c", "u-1", "p", (UUID_A,))
    one = Door("nri", log, report=DoorReport(delivery="no NRI socket", blocking=(("NriUnavailable", "no NRI"),)))
    two = Door("dra", log, gpus={UUID_A: "a claim holds it"}, holders={"c-uid": holder},
               tenants=ClaimTenants((container("claim/gpu", devices=(UUID_B,)),)),
               report=DoorReport(problem="label 'dar' is neither door"))
    three = Door("csi", log, report=DoorReport(problem="also this"))
    doors = Doors([one, two, three])
    assert doors.held_gpus() == {UUID_A: "a claim holds it"}
    assert doors.claim_holders() == {"c-uid": holder}
    assert [t.container for t in doors.tenants().tenants] == ["claim/gpu"]
    report = doors.report()
    assert report.delivery == "no NRI socket" and report.blocking == (("NriUnavailable", "no NRI"),)
    assert report.problem == "label 'dar' is neither door; also this"
    doors.start()
    doors.stop()
    assert log == ["start nri", "start dra", "start csi", "stop csi", "stop dra", "stop nri"]


def test_the_agent_builds_its_doors_with_its_view_and_reads_them(fake_node: FakeNode) -> None:
    seen: list[NodeView] = []

    def build(node: NodeView) -> Door:
        seen.append(node)
        return Door("dra", [], gpus={UUID_A: "its node's front door is DRA"},
                    report=DoorReport(problem="the DRA door's problem"))

    agent = fake_node.start_agent(doors=[build, placing(ClaimTenants((container("claim/gpu", devices=(UUID_B,)),)))])
    assert seen == [agent]
    assert agent.door_gpus() == {UUID_A: "its node's front door is DRA"}
    assert "claim/gpu" in [c.container for c in agent.placed()]
    agent.tick()
    assert "the DRA door's problem" in fake_node.kube.last_condition()["message"]


@pytest.mark.parametrize("slot", ["claims", "dra_gpus", "front_door_problem", "delivery_problem", "door_gpus",
                                  "placed", "blockers"])
def test_nothing_is_assigned_to_the_agent_from_outside(fake_node: FakeNode, slot: str) -> None:
    agent: Any = fake_node.agent()
    with pytest.raises(AttributeError):
        setattr(agent, slot, lambda: {})
