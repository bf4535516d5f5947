"""Who is owed (from bind on) and who may be a victim, as pure decisions (gpufrac.agent.decide.owed, .reclaim)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufrac.agent.decide.attribution import AttributedProcess
from gpufrac.agent.decide.gangs import Gang, pod_group, read_gang, unknown_gang
from gpufrac.agent.decide.model import GpuMemory, GpuProcess, RunningContainer
from gpufrac.agent.decide.owed import owed_containers, owed_on_node
from gpufrac.agent.decide.reclaim import (
    Candidate,
    PodFacts,
    ReclaimPlan,
    ReclaimPolicy,
    ReclaimSettings,
    candidates,
    covered,
    next_victim,
    plan,
    shares,
    to_evict,
)
from gpufrac.core.contract import MIB
from gpufrac.core.owners import Owner
from testkit.agent import UUID_A, canonical_annotations, cid, container, gpu_info, pod

GPUS = {UUID_A: gpu_info(0, UUID_A, 80000)}


def bound(name: str, state: dict[str, Any] | None, **changes: Any) -> dict[str, Any]:
    body = pod(name, uid=f"u-{name}", containers={"app": cid(1)},
               annotations=canonical_annotations("app", request_mib=30000, limit_mib=30000, devices=[UUID_A]))
    [status] = body["status"]["containerStatuses"]
    if state is None:
        del status["state"], status["containerID"]  # bound, the kubelet has not reported the container yet
    else:
        status["state"] = state
    for path, value in changes.items():
        section, key = path.split("__")
        body[section][key] = value
    return body


@pytest.mark.parametrize("state", [
    None,
    {"waiting": {"reason": "ContainerCreating"}},
    {"waiting": {"reason": "CrashLoopBackOff"}},
    {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
    {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},  # restartPolicy Always: it will run again
])
def test_every_container_of_a_bound_pod_is_owed_from_bind_on(state):
    [owed] = owed_containers(bound("a", state))
    assert (owed.pod, owed.container, owed.fraction.request_mib) == ("a", "app", 30000)
    assert owed.container_id == ("" if state is None else cid(1))


@pytest.mark.parametrize("body", [
    bound("gone", None, metadata__deletionTimestamp="2026-01-01T00:00:00Z"),
    bound("done", {"terminated": {"exitCode": 0}}, status__phase="Succeeded"),
    bound("failed", {"terminated": {"exitCode": 1}}, status__phase="Failed"),
    bound("never", {"terminated": {"exitCode": 1}}, spec__restartPolicy="Never"),
    bound("clean", {"terminated": {"exitCode": 0}}, spec__restartPolicy="OnFailure"),
])
def test_pods_going_and_containers_that_will_not_run_again_are_owed_nothing(body):
    assert owed_containers(body) == []


def test_a_container_failing_under_on_failure_is_still_owed():
    assert len(owed_containers(bound("retry", {"terminated": {"exitCode": 1}}, spec__restartPolicy="OnFailure"))) == 1
    assert owed_on_node([bound("x", None), pod("plain", uid="u-p", containers={"app": cid(2)}, annotations={})]) \
        == owed_containers(bound("x", None))  # a pod without fractions is owed nothing


def tenant(pod_name: str, n: int, request_mib: int, limit_mib: int = 60000,
           name: str = "app") -> RunningContainer:
    return container(name, pod=pod_name, uid=f"u-{pod_name}", container_id=cid(n), request_mib=request_mib,
                     limit_mib=limit_mib, devices=(UUID_A,))


def gpu(owed: list[RunningContainer], *used_mib: tuple[RunningContainer, int]):
    attributed = [AttributedProcess(GpuProcess(UUID_A, 1000 + i, mib * MIB, 0), c, None)
                  for i, (c, mib) in enumerate(used_mib)]
    used = sum(mib for _, mib in used_mib) * MIB
    memory = {UUID_A: GpuMemory(UUID_A, 80000 * MIB, 0, used, 80000 * MIB - used)}
    [share] = shares(attributed, owed, GPUS, memory)
    return share


def test_a_process_listed_twice_is_counted_once():
    a, b = tenant("a", 1, 30000), tenant("b", 2, 10000)
    proc = AttributedProcess(GpuProcess(UUID_A, 1002, 50000 * MIB, 0), b, None)
    memory = {UUID_A: GpuMemory(UUID_A, 80000 * MIB, 0, 50000 * MIB, 30000 * MIB)}
    [share] = shares([proc, proc], [a, b], GPUS, memory)
    assert {t.container.pod: t.used_bytes for t in share.tenants} == {"a": 0, "b": 50000 * MIB}
    assert share.shortfall_bytes == 0  # 30000 owed to a, 30000 free: b's usage is in free only once


def test_a_pod_owed_memory_on_the_gpu_is_never_a_candidate():
    a = tenant("a", 1, 30000)
    b_big, b_late = tenant("b", 2, 10000, name="big"), tenant("b", 3, 5000, name="late")
    c = tenant("c", 4, 5000)
    share = gpu([a, b_big, b_late, c], (b_big, 50000), (c, 10000))
    assert [x.pod for x in candidates(share, {})] == ["c"]  # b is above its request in one container, owed in another


def test_pods_at_or_above_the_protected_priority_are_never_candidates():
    a, b, c = tenant("a", 1, 30000), tenant("b", 2, 5000), tenant("c", 3, 5000)
    share = gpu([a, b, c], (b, 30000), (c, 30000))
    facts = {"u-b": PodFacts("b", 1000, 1.0), "u-c": PodFacts("c", 999, 2.0)}
    assert [x.pod for x in candidates(share, facts)] == ["c", "b"]
    owned = {**facts, "u-c": PodFacts("c", 999, 2.0, owner=Owner("apps/v1", "ReplicaSet", "c-1", "u-rs"))}
    assert [x.owner for x in candidates(share, owned)] == [Owner("apps/v1", "ReplicaSet", "c-1", "u-rs"), None]
    protect = ReclaimSettings(ReclaimPolicy.EVICT, protected_priority=1000)
    assert [x.pod for x in candidates(share, facts, protect)] == ["c"]
    assert [x.pod for x in candidates(share, facts, ReclaimSettings(protected_priority=-5))] == []


def test_no_more_of_a_gang_than_it_can_lose_unless_configured():
    """A KAI gang with minMember 2: with 3 running it can lose one member, at 2 none; a PodGroup not read spares all
    its members; minMember 1 is no gang. Lowest priority first still decides which member goes."""
    owed = tenant("owed", 1, 30000)
    w1, w2, w3, solo = (tenant(n, i, 5000) for i, n in enumerate(("w1", "w2", "w3", "solo"), start=2))
    share = gpu([owed, w1, w2, w3, solo], (w1, 20000), (w2, 20000), (w3, 20000), (solo, 20000))

    def facts(gang: Gang | None, solo_gang: Gang | None = None) -> dict[str, PodFacts]:
        found = {f"u-{n}": PodFacts(n, p, 1.0, pod_group="train", gang=gang)
                 for n, p in (("w1", 10), ("w2", 5), ("w3", 20))}
        return found | {"u-solo": PodFacts("solo", 30, 1.0, pod_group="solo", gang=solo_gang)}

    three_running = Gang("team-a", "train", min_member=2, running=3)
    assert [x.pod for x in candidates(share, facts(three_running))] == ["w2", "solo"]
    at_minimum = Gang("team-a", "train", min_member=2, running=2)
    assert [x.pod for x in candidates(share, facts(at_minimum, Gang("team-a", "solo", 1, 1)))] == ["solo"]
    assert [x.pod for x in candidates(share, facts(unknown_gang("team-a", "train")))] == ["solo"]
    everyone = ReclaimSettings(ReclaimPolicy.EVICT, evict_gang_members=True)
    assert [x.pod for x in candidates(share, facts(at_minimum), everyone)] == ["w2", "w1", "w3", "solo"]


def test_a_gang_member_going_already_counts_against_what_the_gang_can_lose():
    owed = tenant("owed", 1, 30000)
    w1, w2 = tenant("w1", 2, 5000), tenant("w2", 3, 5000)
    share = gpu([owed, w1, w2], (w1, 20000), (w2, 20000))
    gang = Gang("team-a", "train", min_member=2, running=3)
    facts = {"u-w1": PodFacts("w1", 0, 2.0, terminating=True, gang=gang), "u-w2": PodFacts("w2", 0, 1.0, gang=gang)}
    found = candidates(share, facts)
    assert [(x.pod, x.terminating) for x in found] == [("w1", True)]  # w1 is the one it can lose


def test_a_podgroup_reads_as_a_gang():
    assert pod_group({"pod-group-name": "pg-1"}) == "pg-1" and pod_group({}) == ""
    obj = {"spec": {"minMember": 4}, "status": {"running": 6}}
    assert read_gang("ns", "pg-1", obj) == Gang("ns", "pg-1", 4, 6) and Gang("ns", "pg-1", 4, 6).spare == 2
    assert read_gang("ns", "pg-1", {"spec": {}}) == Gang("ns", "pg-1", 1, 0)  # KAI's defaults: a single pod
    assert read_gang("ns", "gone", None) is None
    assert read_gang("ns", "pg-1", {"spec": {"minMember": "4"}, "status": {"running": "6"}}) == Gang("ns", "pg-1", 1,
                                                                                                     None)
    assert str(unknown_gang("ns", "pg-1")) == "gang ns/pg-1 (minMember 1, running unknown)"
    assert str(Gang("ns", "pg-1", 4, 6)) == "gang ns/pg-1 (minMember 4, running 6)"


def test_gangs_are_counted_apart_each_to_what_it_can_lose():
    owed = tenant("owed", 1, 60000)
    members = [tenant(n, i, 1000) for i, n in enumerate(("a1", "a2", "a3", "b1", "b2"), start=2)]
    share = gpu([owed, *members], *((m, 5000) for m in members))
    a, b = Gang("ns", "a", min_member=2, running=4), Gang("ns", "b", min_member=2, running=3)
    facts = {f"u-{n}": PodFacts(n, i, 1.0, gang=a if n.startswith("a") else b)
             for i, n in enumerate(("a1", "a2", "a3", "b1", "b2"))}
    assert [x.pod for x in candidates(share, facts)] == ["a1", "a2", "b1"]


def victim(name: str, used_mib: int, terminating: bool = False) -> Candidate:
    return Candidate("ns", name, f"u-{name}", 0, 0.0, used_mib * MIB, used_mib * MIB, terminating)


def plan_of(short_mib: int, *found: Candidate) -> ReclaimPlan:
    return ReclaimPlan(UUID_A, short_mib * MIB, 0, (), found, ReclaimPolicy.EVICT)


def test_next_victim_feeds_back_refusals_and_pods_going():
    p = plan_of(15000, victim("c", 10000), victim("b", 10000), victim("d", 10000))
    assert next_victim(p).pod == "c"
    assert next_victim(p, refused={"u-c"}).pod == "b"  # a refusal moves on, it does not stop
    assert next_victim(p, refused={"u-c", "u-b"}).pod == "d"
    assert next_victim(p, refused={"u-c", "u-b", "u-d"}) is None  # nobody left
    assert next_victim(p, going={"u-c"}).pod == "b"  # c's 10000 MiB do not cover 15000
    assert next_victim(p, going={"u-c", "u-d"}) is None  # 20000 MiB going cover it
    assert [x.pod for x in to_evict(p)] == ["c", "b"]
    assert [x.pod for x in to_evict(p, refused={"u-b"})] == ["c", "d"]


def test_a_terminating_pod_counts_as_freeing_and_is_not_evicted_again():
    p = plan_of(15000, victim("c", 10000, terminating=True), victim("b", 10000))
    assert not covered(p) and next_victim(p).pod == "b"
    assert covered(p, going={"u-b"}) and next_victim(p, going={"u-b"}) is None
    covering = plan_of(10000, victim("c", 10000, terminating=True), victim("b", 10000))
    assert covered(covering) and next_victim(covering) is None and to_evict(covering) == []


def test_a_plan_only_while_short():
    a, b = tenant("a", 1, 30000), tenant("b", 2, 10000)
    settings = ReclaimSettings(ReclaimPolicy.EVICT)
    assert plan(gpu([a, b], (b, 50000)), {}, settings) is None  # 30000 owed, 30000 free
    made = plan(gpu([a, b], (b, 55000)), {}, settings)
    assert made is not None and made.shortfall_bytes == 5000 * MIB
    assert [t.container.pod for t in made.owed] == ["a"] and [c.pod for c in made.candidates] == ["b"]


# ---- the edges of each rule (what `make mutation` asks of these tests) ----

def test_owed_reads_each_container_and_names_it_as_the_pod_does():
    body = pod("two", uid="u-two", containers={"a-done": cid(1), "b-next": cid(2)}, annotations={})
    from gpufrac.core.contract import write_canonical
    from testkit.agent import fraction
    body["metadata"]["annotations"] = write_canonical([
        fraction("a-done", request_mib=1000, limit_mib=1000, devices=[UUID_A]),
        fraction("b-next", request_mib=2000, limit_mib=2000, devices=[UUID_A])])
    body["spec"]["restartPolicy"] = "Never"
    body["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 0}}
    [owed] = owed_containers(body)  # the first ended for good; the next is still owed
    assert (owed.namespace, owed.pod, owed.pod_uid, owed.container) == ("team-a", "two", "u-two", "b-next")
    del body["metadata"]["namespace"], body["metadata"]["name"], body["metadata"]["uid"]
    [nameless] = owed_containers(body)
    assert (nameless.namespace, nameless.pod, nameless.pod_uid) == ("", "", "")


def test_a_container_that_ended_cleanly_without_a_restart_policy_is_owed():
    body = bound("default", {"terminated": {"exitCode": 0}})
    body["spec"].pop("restartPolicy", None)  # Always: it runs again
    assert len(owed_containers(body)) == 1


def test_what_shares_count_for_each_container():
    owed_only = tenant("a", 1, 30000)
    no_request = container("app", pod="lim", uid="u-lim", container_id=cid(5), request_mib=None, limit_mib=20000,
                           devices=(UUID_A,))
    neither = container("app", pod="none", uid="u-none", container_id=cid(6), request_mib=None, limit_mib=None,
                        devices=(UUID_A,))
    unowed = tenant("gone", 7, 5000)  # its pod is going, its process is still on the GPU
    attributed = [AttributedProcess(GpuProcess(UUID_A, 1, 3000 * MIB, 0), unowed, None),
                  AttributedProcess(GpuProcess(UUID_A, 1, 3000 * MIB, 0), unowed, None),  # listed twice
                  AttributedProcess(GpuProcess(UUID_A, 2, 2000 * MIB, 0), unowed, None),
                  AttributedProcess(GpuProcess(UUID_A, 3, None, 0), no_request, None)]  # NVML could not tell
    memory = {UUID_A: GpuMemory(UUID_A, 80000 * MIB, 0, 5000 * MIB, 75000 * MIB)}
    [share] = shares(attributed, [owed_only, no_request, neither], GPUS, memory)
    got = {t.container.pod: (t.request_bytes, t.used_bytes) for t in share.tenants}
    assert got == {"a": (30000 * MIB, 0), "lim": (20000 * MIB, 0), "none": (0, 0), "gone": (5000 * MIB, 5000 * MIB)}
    assert [t.container for t in share.tenants if t.container.pod == "gone"] == [unowed]
    assert share.free_bytes == 75000 * MIB and share.owed_bytes == 50000 * MIB


def test_a_container_without_comparable_devices_is_on_no_gpu():
    mig = container("app", pod="m", uid="u-m", container_id=cid(8), devices=("MIG-abc",))
    none = container("app", pod="n", uid="u-n", container_id=cid(9), devices=())
    memory = {UUID_A: GpuMemory(UUID_A, 80000 * MIB, 0, 0, 80000 * MIB)}
    assert shares([], [mig, none], GPUS, memory) == []


def test_one_byte_decides():
    a, b = tenant("a", 1, 30000), tenant("b", 2, 10000)
    settings = ReclaimSettings(ReclaimPolicy.EVICT)
    # a owes 1 byte: it is owed, so it is no candidate, and the plan is made for it
    one_owed = AttributedProcess(GpuProcess(UUID_A, 1, 30000 * MIB - 1, 0), a, None)
    above = AttributedProcess(GpuProcess(UUID_A, 2, 10000 * MIB + 1, 0), b, None)  # 1 byte above its request
    # 1 byte owed: 2 free fit it, 1 free fits it exactly, 0 free is 1 byte short
    for free_bytes, short in ((2, False), (1, False), (0, True)):
        memory = {UUID_A: GpuMemory(UUID_A, 80000 * MIB, 0, 0, free_bytes)}
        [share] = shares([one_owed, above], [a, b], GPUS, memory)
        made = plan(share, {}, settings)
        assert (made is not None) == short, free_bytes
    assert made is not None and made.free_bytes == 0 and made.shortfall_bytes == 1
    assert [t.container.pod for t in made.owed] == ["a"]
    assert [(c.namespace, c.pod, c.above_request_bytes) for c in made.candidates] == [("team-a", "b", 1)]


def test_a_pod_not_in_the_list_counts_as_priority_zero_and_the_oldest():
    a, b, c, d = tenant("a", 1, 30000), tenant("b", 2, 1000), tenant("c", 3, 1000), tenant("d", 4, 1000)
    share = gpu([a, b, c, d], (b, 20000), (c, 20000), (d, 20000))
    facts = {"u-b": PodFacts("b", -1, 5.0), "u-d": PodFacts("d", 0, 1.0)}  # c is unknown
    found = candidates(share, facts)
    assert [x.pod for x in found] == ["b", "d", "c"]
    assert (found[2].priority, found[2].started) == (0, 0.0)


def test_a_pod_is_judged_on_all_its_containers_on_the_gpu():
    a = tenant("a", 1, 30000)
    first, second = tenant("b", 2, 1000, name="one"), tenant("b", 3, 1000, name="two")
    [found] = candidates(gpu([a, first, second], (first, 5000), (second, 7000)), {})
    assert (found.used_bytes, found.above_request_bytes) == (12000 * MIB, 10000 * MIB)


def test_a_plan_leaves_out_protected_pods():
    a, b = tenant("a", 1, 30000), tenant("b", 2, 10000)
    made = plan(gpu([a, b], (b, 55000)), {"u-b": PodFacts("b", 10, 1.0)},
                ReclaimSettings(ReclaimPolicy.EVICT, protected_priority=10))
    assert made is not None and made.candidates == ()


def two_gpus(short_mib_a: int, short_mib_b: int) -> list:
    from gpufrac.agent.decide.reclaim import GpuShare, Tenant
    owed = tenant("a", 1, 80000)
    return [GpuShare(uuid, 80000 * MIB - short * MIB, (Tenant(owed, 80000 * MIB, 0),))
            for uuid, short in (("GPU-1", short_mib_a), ("GPU-2", short_mib_b))]


def test_each_gpu_is_decided_even_after_one_that_fits():
    from gpufrac.agent.decide.reclaim import Episode, decide
    now = ReclaimSettings(ReclaimPolicy.EVICT, grace_seconds=0.0, hysteresis_bytes=100 * MIB)
    plans, episodes = decide(two_gpus(-500, 10), {}, {}, 0.0, now)  # GPU-1 fits with room to spare
    assert [p.gpu_uuid for p in plans] == ["GPU-2"] and set(episodes) == {"GPU-2"}
    plans, episodes = decide(two_gpus(-50, 10), {}, {}, 0.0, now)  # GPU-1 within the band, no episode
    assert [p.gpu_uuid for p in plans] == ["GPU-2"] and set(episodes) == {"GPU-2"}
    _, episodes = decide(two_gpus(-100, 10), {}, {"GPU-1": Episode(0.0)}, 1.0, now)  # exactly the band: over
    assert set(episodes) == {"GPU-2"}


def test_the_shortage_starts_and_breaks_at_zero():
    from gpufrac.agent.decide.reclaim import GpuShare, Tenant, decide
    owed = tenant("a", 1, 80000)
    settings = ReclaimSettings(ReclaimPolicy.OFF, grace_seconds=10.0, hysteresis_bytes=100 * MIB)

    def at(short_bytes: int) -> list[GpuShare]:
        return [GpuShare(UUID_A, 80000 * MIB - short_bytes, (Tenant(owed, 80000 * MIB, 0),))]

    _, episodes = decide(at(0), {}, {}, 0.0, settings)
    assert episodes == {}  # exactly fits: no shortage
    _, episodes = decide(at(1), {}, {}, 0.0, settings)
    assert episodes[UUID_A].short_since == 0.0  # one byte short: it starts
    _, kept = decide(at(1), {}, episodes, 5.0, settings)
    assert kept[UUID_A].short_since == 0.0
    _, broken = decide(at(0), {}, episodes, 5.0, settings)
    assert broken[UUID_A].short_since is None  # fits again (within the band): the window starts over


def test_a_pod_owed_a_single_byte_is_no_candidate():
    a = tenant("a", 1, 30000)
    big, small = tenant("b", 2, 1000, name="big"), tenant("b", 3, 1000, name="small")
    attributed = [AttributedProcess(GpuProcess(UUID_A, 2, 9000 * MIB, 0), big, None),
                  AttributedProcess(GpuProcess(UUID_A, 3, 1000 * MIB - 1, 0), small, None)]
    memory = {UUID_A: GpuMemory(UUID_A, 80000 * MIB, 0, 0, 0)}
    [share] = shares(attributed, [a, big, small], GPUS, memory)
    assert candidates(share, {}) == ()
