"""Which container a GPU process is, by its cgroup (decide/attribution.py, decide/proc_text.py): what reclaim
charges each tenant rests on it."""

from __future__ import annotations

import pytest

from gpufrac.agent.decide.attribution import attribute, in_fractional_container
from gpufrac.agent.decide.claim_tenants import NO_CLAIMS, ClaimTenants
from gpufrac.agent.decide.model import GpuProcess
from gpufrac.agent.decide.proc_text import (
    container_ids_in_cgroup,
    normalize_container_id,
    parse_environ,
    pod_uids_in_cgroup,
)
from testkit.agent import UUID_A, UUID_B, cid, container

POD = "0a1b2c3d-1111-2222-3333-444455556666"
OTHER_POD = "0a1b2c3d-1111-2222-3333-777777777777"
X = container("app", pod="x", uid="u-x", container_id=cid(1))
CLAIM = container("claim/gpu", pod="c", uid=POD, container_id=cid(9))


def cgroup(pod_uid: str, container_id: str) -> str:
    return f"0::/kubepods.slice/kubepods-pod{pod_uid.replace('-', '_')}.slice/cri-containerd-{container_id}.scope\n"


CLAIMS = ClaimTenants((CLAIM,), {(POD, UUID_A): CLAIM}, frozenset({POD}))


def test_each_process_is_its_containers_or_its_claims_or_no_ones():
    processes = [GpuProcess(UUID_A, 10, 1, None),  # its cgroup not read: no one's
                 GpuProcess(UUID_A, 11, 2, None),  # container X
                 GpuProcess(UUID_A, 12, 3, None),  # the claim's pod, on the claim's GPU
                 GpuProcess(UUID_B, 13, 4, None),  # the claim's pod on another GPU: not the claim's share
                 GpuProcess(UUID_A, 14, 5, None)]  # of no fraction
    cgroups = {11: cgroup(OTHER_POD, cid(1)), 12: cgroup(POD, cid(50)), 13: cgroup(POD, cid(50)),
               14: cgroup(OTHER_POD, cid(60))}
    environs = {11: {"A": "1"}}
    found = attribute(processes, {cid(1): X}, cgroups, environs, CLAIMS)
    assert [(a.process.pid, a.container.pod, a.environ) for a in found] == [(11, "x", {"A": "1"}), (12, "c", None)]
    assert attribute(processes, {cid(1): X}, cgroups, environs) == found[:1]  # no claims: the claim's pod is no one's
    assert attribute(processes, {}, cgroups, {}, NO_CLAIMS) == []


def test_a_process_of_a_claims_pod_is_the_claims_on_its_gpu_whichever_pod_is_named_first():
    second = ClaimTenants((CLAIM,), {(OTHER_POD, UUID_A): CLAIM}, frozenset({OTHER_POD}))
    two = f"12:memory:/kubepods/pod{POD}/{cid(50)}\n11:cpu:/kubepods/pod{OTHER_POD}/{cid(50)}\n"
    [found] = attribute([GpuProcess(UUID_A, 12, 3, None)], {}, {12: two}, {}, second)
    assert found.container is CLAIM


def test_whose_environ_is_read():
    assert in_fractional_container(cgroup(OTHER_POD, cid(1)), {cid(1): X})
    assert in_fractional_container(cgroup(POD, cid(50)), {}, CLAIMS)
    assert not in_fractional_container(cgroup(POD, cid(50)), {})
    assert not in_fractional_container(cgroup(OTHER_POD, cid(50)), {cid(1): X}, CLAIMS)
    assert not in_fractional_container(cgroup(POD, cid(50)), {}, ClaimTenants((), {}, frozenset({POD})))


def test_cgroup_paths_with_a_colon_in_them():
    text = f"0::/kubepods/pod{POD}/odd:name/{cid(3)}\n"
    assert container_ids_in_cgroup(text) == {cid(3)} and pod_uids_in_cgroup(text) == {POD}
    assert container_ids_in_cgroup("garbage\n") == set()


@pytest.mark.parametrize(("status", "expected"), [
    (f"containerd://{cid(1)}", cid(1)), (f" cri-o://{cid(1)} ", cid(1)), (f"docker:///{cid(1)}", cid(1)),
    (cid(1), cid(1))])
def test_a_status_container_id_without_its_scheme(status: str, expected: str):
    assert normalize_container_id(status) == expected


def test_an_environ_with_empty_entries_and_bytes_that_are_not_utf8():
    assert parse_environ(b"A=1\0\0B=2\0NOVALUE\0C=\xff\0\xfe=x\0") == {"A": "1", "B": "2", "C": "\ufffd",
                                                                       "\ufffd": "x"}
