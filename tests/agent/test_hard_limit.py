"""Issue 43, the hard limit verified per container (decide.hard_limits, programs.hard_limits): the agent sets each
fractional container's limit on its own cgroup through NVML (nvmlDeviceSetMemoryLimits_v1, the fake NVML records
it by cgroup), reads it back, and labels each mode's boundary: hard, cooperative or none."""

from __future__ import annotations

import pytest

from e2e.toolkit.wait import wait_until
from gpufrac.agent.decide.hard_limits import WithoutHardLimit, cgroup_dir, held_by
from gpufrac.agent.node.node_loop import Agent
from gpufrac.core.annotations import ComputeMode
from testkit.agent import UUID_A, UUID_B, FakeNode, cid, container, gpu_info
from testkit.fakes.mps_client import ClientLimits, connect
from testkit.fakes.state import CGROUP_FORMS

SM = ComputeMode.SM_SHARING
PINNED = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MIB = 1 << 20
TS_LABEL, SM_LABEL = "gpufrac.io/boundary.time-slicing", "gpufrac.io/boundary.sm-sharing"


def _running(node: FakeNode, form: str = "v2-containerd-systemd") -> tuple[str, str]:
    """The node's two containers, a process each (`train`'s app on GPU A, `infer`'s worker on GPU B); their cgroups."""
    node.proc.add(4101, cid(1), {}, form=form, pod_uid="u-train")
    node.proc.add(4102, cid(2), {}, form=form, pod_uid="u-infer")
    paths = [cgroup_dir(CGROUP_FORMS[form].format(uid=uid, id=cid(n))) for n, uid in ((1, "u_train"), (2, "u_infer"))]
    assert paths[0] is not None and paths[1] is not None
    return paths[0], paths[1]


def _ticked(node: FakeNode) -> Agent:
    agent = node.start_agent()
    agent.tick()
    wait_until(lambda: agent.daemon_statuses()[SM].up, timeout=10, what="the sm-sharing daemon")
    agent.tick()
    return agent


def test_the_pure_parts_find_a_cgroup_in_both_versions() -> None:
    assert cgroup_dir("0::/kubepods.slice/x.scope\n") == "/sys/fs/cgroup/kubepods.slice/x.scope"
    assert cgroup_dir("12:memory:/kubepods/pod1/c\n11:cpuset:/kubepods/pod1/c\n") == \
        "/sys/fs/cgroup/memory/kubepods/pod1/c"
    assert cgroup_dir("4:devices:/x\n") is None


def test_each_fraction_is_held_by_its_cgroup_limit_as_read_back_and_the_modes_are_labelled_hard(
        fake_node: FakeNode) -> None:
    train, infer = _running(fake_node)
    agent = _ticked(fake_node)
    limits = fake_node.gpus.memory_limits()
    assert limits[(UUID_A, train)] == 20000 * MIB  # time-slicing: its limit on its own cgroup
    assert limits[(UUID_B, infer)] == 16000 * MIB
    assert agent.cgroup_limits.verified == {(cid(1), UUID_A): train, (cid(2), UUID_B): infer}
    assert (fake_node.kube.labels[TS_LABEL], fake_node.kube.labels[SM_LABEL]) == ("hard", "hard")


def test_a_client_naming_an_invisible_gpu_is_still_held_by_its_cgroup_limit(fake_node: FakeNode) -> None:
    """MPS drops every pinned limit for such a client (NVIDIA's measurement), the namespace's included; the driver's
    limit on the container's cgroup still holds it."""
    _, infer = _running(fake_node)
    agent = _ticked(fake_node)
    route = agent.pipe_route("u-infer", "worker")
    assert route is not None
    escape = {PINNED: "0=2048M,1=4096M"}
    assert connect(route, UUID_B, env=escape).pinned_mib is None  # MPS alone: the whole GPU
    assert connect(route, UUID_B, env=escape, cgroup=infer) == ClientLimits(16000, 100)


@pytest.mark.parametrize("driver", ["refused-v1", "pre-615"])
def test_where_the_driver_holds_no_cgroup_limit_the_node_says_so(fake_node: FakeNode, driver: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """cgroup v1 under the real driver's refusal (the fake NVML's switch), or a driver before r615: no mode is
    labelled hard, and the condition names the containers whose limit the driver does not hold."""
    if driver == "refused-v1":
        monkeypatch.setenv("GPUFRAC_FAKE_NVML_REFUSE_CGROUP_V1", "1")
        paths = _running(fake_node, form="v1-cgroupfs")
    else:
        fake_node.gpus.set(driver_version="550.54.15", cuda_driver_version=12040)
        paths = _running(fake_node)
    _ticked(fake_node)
    assert not [key for key in fake_node.gpus.memory_limits() if key[1] in paths]
    assert (fake_node.kube.labels[TS_LABEL], fake_node.kube.labels[SM_LABEL]) == ("none", "cooperative")
    message = fake_node.kube.last_condition()["message"]
    assert "team-a/train/app: the driver holds no limit on its cgroup" in message, message


def test_an_operator_who_requires_the_hard_limit_gets_fractions_refused_where_the_driver_cannot_hold_it(
        fake_node: FakeNode) -> None:
    """A driver before r615 (legacy MPS serves sm-sharing; time-slicing is not served there anyway)."""
    fake_node.gpus.set(driver_version="550.54.15", cuda_driver_version=12040)
    reporting = _ticked(fake_node)
    assert reporting.not_served[SM] is None  # report (the default): still served, the labels say it
    assert fake_node.kube.labels[SM_LABEL] == "cooperative"
    reporting.shutdown()
    refusing = fake_node.start_agent(without_hard_limit=WithoutHardLimit.REFUSE)
    refusing.tick()
    wait_until(lambda: refusing.daemon_statuses()[SM].up, timeout=10, what="the sm-sharing daemon")
    refusing.tick()
    reason = refusing.not_served[SM] or ""
    assert "cannot hold a fraction's memory limit on its cgroup" in reason and "--without-hard-limit" in reason


def test_the_over_limit_report_says_what_holds_each_fraction() -> None:
    gpus = (gpu_info(0, UUID_A), gpu_info(1, UUID_B))
    ts = container("t", container_id=cid(1), mode=ComputeMode.TIME_SLICING, limit_mib=4096, devices=(UUID_A,))
    sm = container("s", container_id=cid(2), mode=SM, limit_mib=4096, devices=("1",))
    held = held_by([ts, sm], gpus, {(cid(1), UUID_A)})
    assert held == {(cid(1), UUID_A): "its cgroup limit, set through NVML and read back (hard)",
                    (cid(2), UUID_B): "the MPS daemon side only (cooperative)"}
    assert held_by([ts], gpus, set())[(cid(1), UUID_A)] == "its env only (nothing a process must keep)"
