"""Issue 45's pure decisions: reclaim owes only what can be given (the unattributed use counted once, nothing for a
container the node refuses or a pod going), spares what it cannot read, and sees what the driver took back."""

from __future__ import annotations

from dataclasses import replace

from gpufrac.agent.decide.attribution import AttributedProcess
from gpufrac.agent.decide.gangs import Gang, read_gang, read_sub_gang, sub_group
from gpufrac.agent.decide.model import GpuMemory, GpuProcess, RunningContainer
from gpufrac.agent.decide.pod_facts import pod_facts
from gpufrac.agent.decide.reclaim import GpuShare, PodFacts, Tenant, candidates, others_use, shares
from gpufrac.agent.decide.request_fit import admitted
from gpufrac.agent.decide.soft_limits import above_request, ended
from gpufrac.core.contract import MIB
from gpufrac.core.owners import Owner
from testkit.agent import UUID_A, UUID_B, cid, container, gpu_info, pod

TOTAL = 80000
GPUS = {UUID_A: gpu_info(0, UUID_A, TOTAL), UUID_B: gpu_info(1, UUID_B, TOTAL)}
POD_UID = "0a1b2c3d-1111-2222-3333-444455556666"  # a tenant's pod, as the kubelet names its cgroup
CGROUP = "0::/kubepods.slice/kubepods-pod{uid}.slice/cri-containerd-{id}.scope\n"


def tenant(name: str, n: int, request_mib: int, *, started: bool = True, gpu: str = UUID_A) -> RunningContainer:
    c = container("app", pod=name, uid=f"u-{name}", container_id=cid(n), request_mib=request_mib,
                  limit_mib=TOTAL, devices=(gpu,))
    return c if started else replace(c, container_id="")


def memory(used_mib: int, gpu: str = UUID_A) -> dict[str, GpuMemory]:
    return {gpu: GpuMemory(gpu, TOTAL * MIB, 0, used_mib * MIB, (TOTAL - used_mib) * MIB)}


def charged(c: RunningContainer, pid: int, mib: int | None, gpu: str = UUID_A) -> AttributedProcess:
    return AttributedProcess(GpuProcess(gpu, pid, None if mib is None else mib * MIB, None), c, None)


D, E = tenant("d", 1, 30000), tenant("e", 2, 10000)


def test_unattributed_use_is_counted_once_against_the_gpu():
    # D uses 30000 that NVML charges to no tenant; E uses 30000 of its 10000 request; 20000 free
    [share] = shares([charged(E, 2, 30000)], [D, E], GPUS, memory(60000))
    assert share.unattributed_bytes == 30000 * MIB
    assert share.owed_bytes == 0 and share.shortfall_bytes == -20000 * MIB
    # a usage NVML does not tell is unattributed too
    [share] = shares([charged(D, 1, None), charged(E, 2, 30000)], [D, E], GPUS, memory(60000))
    assert share.unattributed_bytes == 30000 * MIB and share.owed_bytes == 0
    # what is known to be no tenant's is not taken off what is owed
    [share] = shares([charged(E, 2, 30000)], [D, E], GPUS, memory(60000), {UUID_A: 30000 * MIB})
    assert share.unattributed_bytes == 0 and share.owed_bytes == 30000 * MIB
    assert share.shortfall_bytes == 10000 * MIB


def test_unattributed_use_is_taken_only_off_what_started_tenants_are_owed():
    # D not created yet (no process can be its): its whole request stays owed, whatever is unattributed
    late = tenant("d", 1, 30000, started=False)
    [share] = shares([charged(E, 2, 30000)], [late, E], GPUS, memory(70000))
    assert share.unattributed_bytes == 40000 * MIB and share.owed_bytes == 30000 * MIB
    # only as much as started tenants are owed: F (20000, started, uses nothing) hides at most its 20000
    f = tenant("f", 3, 20000)
    [share] = shares([charged(E, 2, 30000)], [late, E, f], GPUS, memory(70000))
    assert share.owed_bytes == 30000 * MIB
    # a claim's share may hide use too (its pods' processes)
    claim = replace(tenant("c", 4, 20000, started=False), claim="c/gpu", container="c/gpu")
    assert Tenant(claim, 1, 0).may_hide_use and not Tenant(late, 1, 0).may_hide_use and Tenant(D, 1, 0).may_hide_use
    [share] = shares([charged(E, 2, 30000)], [claim, E], GPUS, memory(70000))
    assert share.owed_bytes == 0
    [share] = shares([charged(E, 2, 30000)], [claim, E], GPUS, memory(45000))  # 15000 unattributed
    assert share.owed_bytes == 5000 * MIB


def test_a_tenant_seen_but_not_owed_is_owed_nothing_and_may_still_be_a_candidate():
    going = tenant("g", 5, 40000)
    [share] = shares([charged(going, 5, 10000), charged(E, 2, 50000)], [E], GPUS, memory(60000))
    by_pod = {t.container.pod: t for t in share.tenants}
    assert not by_pod["g"].owed and by_pod["g"].owed_bytes == 0 and by_pod["e"].owed
    assert by_pod["g"].request_bytes == 40000 * MIB and by_pod["g"].used_bytes == 10000 * MIB
    assert share.owed_bytes == 0
    above = shares([charged(going, 5, 50000)], [], GPUS, memory(50000))[0]
    assert [c.pod for c in candidates(above, {})] == ["g"]


def test_others_use_counts_only_processes_known_to_be_no_tenants():
    processes = [GpuProcess(UUID_A, 12, None, None),  # its usage not told (first: those after it still count)
                 GpuProcess(UUID_A, 10, 1000 * MIB, None),  # a process of no fraction: counted
                 GpuProcess(UUID_A, 17, 64000 * MIB, None),  # another: added
                 GpuProcess(UUID_B, 11, 2000 * MIB, None),  # on the other GPU: counted there
                 GpuProcess(UUID_A, 13, 4000 * MIB, None),  # its cgroup not read
                 GpuProcess(UUID_A, 14, 8000 * MIB, None),  # an MPS server: may hold its clients'
                 GpuProcess(UUID_A, 15, 16000 * MIB, None),  # a tenant's, attributed
                 GpuProcess(UUID_A, 16, 32000 * MIB, None)]  # in a tenant pod's cgroup, its container unknown
    cgroups = {10: CGROUP.format(uid="x", id=cid(10)), 11: CGROUP.format(uid="x", id=cid(11)),
               12: CGROUP.format(uid="x", id=cid(12)), 14: CGROUP.format(uid="s", id=cid(14)),
               15: CGROUP.format(uid="x", id=cid(2)), 17: CGROUP.format(uid="y", id=cid(17)),
               16: CGROUP.format(uid=POD_UID.replace("-", "_"), id=cid(16))}
    attributed = [AttributedProcess(next(p for p in processes if p.pid == 15), E, None)]
    found = others_use(processes, attributed, cgroups, {POD_UID, "u-e"}, [14])
    assert found == {UUID_A: 65000 * MIB, UUID_B: 2000 * MIB}
    # the same PID on another GPU is judged there
    assert others_use([GpuProcess(UUID_B, 15, 5 * MIB, None)], attributed, cgroups, set(), []) == {
        UUID_B: 5 * MIB}


def test_a_container_the_node_refuses_is_owed_nothing():
    a, b = tenant("a", 1, 40000), tenant("b", 2, 40000)
    c = tenant("c", 3, 20000, started=False)
    usable = {UUID_A: TOTAL}
    assert admitted([a, b, c], list(GPUS.values()), usable) == [a, b]  # 100000 of 80000: C refused at creation
    assert admitted([a, c], list(GPUS.values()), usable) == [a, c]  # 60000 of 80000: it fits
    assert admitted([a, b, c], list(GPUS.values()), {}) == [a, b, c]  # usable memory not measured yet: kept
    assert admitted([a, b, c], list(GPUS.values()), {UUID_A: 100000}) == [a, b, c]  # exactly full: fits
    claim = replace(c, claim="c/gpu", container="c/gpu")
    assert admitted([a, b, claim], list(GPUS.values()), usable) == [a, b, claim]  # prepared: owed
    elsewhere = tenant("c", 3, 20000, started=False, gpu=UUID_B)
    assert admitted([a, b, elsewhere], list(GPUS.values()), usable) == [a, b, elsewhere]


def test_a_pod_that_could_not_be_read_is_no_candidate():
    [share] = shares([charged(D, 1, 10000), charged(E, 2, 65000)], [D, E], GPUS, memory(75000))
    assert [c.pod for c in candidates(share, {"u-e": PodFacts("e", 0, 1.0)})] == ["e"]
    assert candidates(share, {"u-e": PodFacts("e", 0, 1.0, unread=True)}) == ()


def test_a_sub_group_at_its_minimum_keeps_its_members():
    gang = read_gang("ns", "train", {"spec": {"minMember": 3, "subGroups": [
        {"name": "workers", "minMember": 2}, {"name": "ps"}, {"minMember": 4}, "junk"]}, "status": {"running": 5}})
    assert gang is not None and gang.sub_groups == {"workers": 2, "ps": 1} and gang.spare == 2
    member = {"metadata": {"annotations": {"pod-group-name": "train"}}, "status": {"phase": "Running"}}
    other_gang = {"metadata": {"annotations": {"pod-group-name": "other"}}, "status": {"phase": "Running"}}
    pending = {"metadata": {"annotations": {"pod-group-name": "train"}}, "status": {"phase": "Pending"}}
    going = {"metadata": {"annotations": {"pod-group-name": "train"}, "deletionTimestamp": "x"},
             "status": {"phase": "Running"}}
    workers = read_sub_gang(gang, "workers", [member, member, other_gang, pending, going])
    assert workers == Gang("ns", "train/workers", 2, 2, sub=True) and workers.spare == 0
    ps = read_sub_gang(gang, "ps", [member, member])
    assert ps is not None and ps.spare == 1  # minMember 1 of a sub-group still counts
    assert read_sub_gang(gang, "ps", [member]).spare == 0  # type: ignore[union-attr]
    assert read_sub_gang(gang, "nope", [member]) is None
    unlisted = read_sub_gang(gang, "workers", None)
    assert unlisted is not None and unlisted.spare == 0
    assert Gang("ns", "single", 1, 1).spare is None  # a PodGroup of one pod is no gang
    assert sub_group({"kai.scheduler/subgroup-name": "workers"}) == "workers" and sub_group({}) == ""
    assert sub_group({"kai.scheduler/subgroup-name": 3}) == ""


def test_within_gangs_holds_the_sub_group_as_well_as_the_gang():
    d, e = tenant("d", 1, 1000), tenant("e", 2, 1000)
    owed = tenant("o", 3, 40000)
    [share] = shares([charged(d, 1, 20000), charged(e, 2, 20000), charged(owed, 3, 0)], [d, e, owed], GPUS,
                     memory(60000))
    gang = Gang("ns", "train", 2, 4)  # two to spare
    sub = Gang("ns", "train/workers", 2, 3, sub=True)  # one to spare
    facts = {"u-d": PodFacts("d", 0, 1.0, gang=gang, sub_gang=sub),
             "u-e": PodFacts("e", 0, 2.0, gang=gang, sub_gang=sub)}
    assert [c.pod for c in candidates(share, facts)] == ["e"]
    facts["u-d"] = replace(facts["u-d"], sub_gang=None)
    assert [c.pod for c in candidates(share, facts)] == ["e", "d"]
    facts["u-d"] = replace(facts["u-d"], gang=Gang("ns", "train", 2, 3))
    facts["u-e"] = replace(facts["u-e"], gang=Gang("ns", "train", 2, 3))
    assert [c.pod for c in candidates(share, facts)] == ["e"]


def test_pod_facts_read_the_sub_group():
    body = pod("p", uid="u-p", containers={"app": cid(1)}, annotations={"pod-group-name": "train"})
    body["metadata"]["labels"]["kai.scheduler/subgroup-name"] = "workers"
    facts = pod_facts([body])["u-p"]
    assert (facts.pod_group, facts.sub_group) == ("train", "workers")


def test_what_the_driver_took_back():
    [share] = shares([charged(D, 1, 10000), charged(E, 2, 25000), charged(E, 3, 5000)], [D, E], GPUS,
                     memory(40000))
    found = above_request([share], [charged(D, 1, 10000), charged(E, 2, 25000), charged(E, 3, 5000)])
    assert sorted(found) == [(2, UUID_A), (3, UUID_A)]  # E is above its request: both its processes
    assert found[(2, UUID_A)].tenant.above_request_bytes == 20000 * MIB
    still = [GpuProcess(UUID_A, 1, 1, None), GpuProcess(UUID_A, 3, 1, None), GpuProcess(UUID_B, 2, 1, None)]
    assert [(g.pid, g.gpu_uuid) for g in ended(found, still)] == [(2, UUID_A)]
    assert ended(found, [GpuProcess(UUID_A, 2, 1, None), GpuProcess(UUID_A, 3, 1, None)]) == []
    assert above_request([GpuShare(UUID_A, 0, ())], [charged(E, 2, 25000)]) == {}
    one_byte = GpuShare(UUID_A, 0, (Tenant(E, 10000 * MIB, 10000 * MIB + 1),))
    assert list(above_request([one_byte], [charged(E, 2, 25000)])) == [(2, UUID_A)]
    assert above_request([GpuShare(UUID_A, 0, (Tenant(E, 10000 * MIB, 10000 * MIB),))], [charged(E, 2, 1)]) == {}


def test_pod_facts():
    body = pod("p", uid="u-p", containers={"app": cid(1)}, annotations={})
    body["spec"]["priority"] = -3
    body["metadata"]["creationTimestamp"] = "2026-01-02T00:00:00Z"
    assert pod_facts([body])["u-p"].priority == -3
    assert pod_facts([body])["u-p"].started == 1767312000.0
    body["status"]["startTime"] = "2026-01-03T00:00:00Z"
    assert pod_facts([body])["u-p"].started == 1767398400.0
    assert pod_facts([body])["u-p"].owner is None  # a bare pod
    body["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u-n"},  # an owner that does not control it
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u-job", "controller": True}]
    assert pod_facts([body])["u-p"].owner == Owner("batch/v1", "Job", "train", "u-job")
    assert not pod_facts([body])["u-p"].terminating
    body["metadata"]["deletionTimestamp"] = "2026-01-04T00:00:00Z"
    body["metadata"]["annotations"] = {"pod-group-name": "train"}
    facts = pod_facts([body])["u-p"]
    assert facts.terminating and facts.pod_group == "train" and facts.name == "p" and facts.sub_group == ""
    body["spec"]["priority"] = "high"  # not a number: 0
    body["status"]["startTime"] = "not a time"
    assert (pod_facts([body])["u-p"].priority, pod_facts([body])["u-p"].started) == (0, 1767312000.0)
    del body["metadata"]["creationTimestamp"]
    assert pod_facts([body])["u-p"].started == 0.0
    body["metadata"]["creationTimestamp"] = 1767312000  # not a time stamp's text
    assert pod_facts([body])["u-p"].started == 0.0
    del body["metadata"]["uid"], body["metadata"]["name"]
    assert pod_facts([body])[""].name == ""
