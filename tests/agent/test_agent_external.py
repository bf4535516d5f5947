"""The agent with `--mps-daemons external`: the daemons belong to `gpufrac mps` processes (here: real supervisors
of the fake nvidia-cuda-mps-control, as `gpufrac mps` runs them); the agent finds them through the real /proc,
never starts or quits them, and reports their restarts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from e2e.toolkit.wait import wait_until
from gpufrac.agent.csi.service import node_dirs
from gpufrac.agent.decide.model import DaemonState
from gpufrac.agent.decide.mps_config import daemon_spec
from gpufrac.agent.edges.metrics import AgentMetrics
from gpufrac.agent.edges.mps_status import read_status, write_status
from gpufrac.agent.edges.nvml import NvmlSource
from gpufrac.agent.edges.supervisor import MpsSupervisor, RestartPolicy
from gpufrac.agent.node.agent_config import DaemonOwner
from gpufrac.agent.node.node_loop import Agent
from gpufrac.cli import build_parser
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.buildinfo import build, version
from testkit.agent import UUID_A, UUID_B, two_pod_node


@pytest.fixture
def node(tmp_path: Path, fake_gpus, mps_binary):
    fake_gpus.gpu(UUID_A, memory_total_mib=80000).gpu(UUID_B, memory_total_mib=80000)
    _, kube, config = two_pod_node(tmp_path, mps_binary, RestartPolicy(0.01, 0.05, 3, 300.0))
    config = replace(config, mps_daemons=DaemonOwner.EXTERNAL, proc_root=Path("/proc"))
    supervisors = {}
    for mode in ComputeMode:
        spec = daemon_spec(mode, mps_v3=True, binary=mps_binary, mps_root=config.mps_root,
                           log_root=config.mps_log_root, config_dir=tmp_path / "mps-svc-config")
        supervisors[mode] = MpsSupervisor(spec, RestartPolicy(0.5, 1.0, 5, 300.0), quit_timeout=5.0)
        supervisors[mode].start()
    wait_until(lambda: all(s.status().up for s in supervisors.values()), 20, "both daemons up", 0.02)
    yield kube, config, supervisors
    for s in supervisors.values():
        s.stop()


def records(supervisor: MpsSupervisor) -> str:
    path = supervisor.spec.log_dir / "fake-mps-record.jsonl"
    return path.read_text() if path.exists() else ""


def test_the_agent_finds_the_daemons_and_its_shutdown_leaves_them_running(node):
    kube, config, supervisors = node
    pids = {mode: s.pid for mode, s in supervisors.items()}
    agent = Agent(config, kube, NvmlSource(), AgentMetrics())
    agent.start()
    agent.tick()
    statuses = agent.daemon_statuses()
    assert {mode: (s.up, s.pid) for mode, s in statuses.items()} == {mode: (True, pid) for mode, pid in pids.items()}
    assert kube.last_condition()["status"] == "True"
    agent.shutdown()
    assert {mode: s.pid for mode, s in supervisors.items()} == pids
    assert all(s.status().up for s in supervisors.values())
    assert all('"command": "quit"' not in records(s) for s in supervisors.values()), "the agent never quits them"
    assert kube.last_condition()["reason"] == "AgentStopped"


def test_a_restart_is_a_new_pid_counted_as_metric_event_and_condition_reason(node):
    kube, config, supervisors = node
    sm = supervisors[ComputeMode.SM_SHARING]
    agent = Agent(config, kube, NvmlSource(), AgentMetrics())
    agent.start()
    agent.tick()
    old = sm.pid
    flag = sm.spec.log_dir / "fake-crash"
    flag.write_text("")
    wait_until(lambda: sm.status().state is DaemonState.BACKOFF, 20, "the daemon in backoff", 0.02)
    write_status(sm.spec.log_dir, sm.status())  # what `gpufrac mps` keeps current
    agent.tick()
    condition = kube.last_condition("gpu-sharing.nvidia.com/Ready")
    assert (condition["status"], condition["reason"]) == ("False", "MpsDaemonRestarting")
    assert "the sm-sharing MPS control daemon exited with code 1 and is being restarted with backoff" in \
        condition["message"]
    assert node_dirs(agent).not_served[ComputeMode.SM_SHARING].startswith("its MPS control daemon is backoff")
    flag.unlink()
    wait_until(lambda: sm.status().up and sm.pid != old, 20, "a new daemon", 0.02)
    agent.tick()
    # One restart, or more when a loaded machine let the supervisor retry (and crash again) before the flag
    # went: each new PID the agent saw is one restart and one metric increment; one Event per tick that saw any.
    restarts = agent.daemon_statuses()[ComputeMode.SM_SHARING].restarts
    assert restarts >= 1
    assert agent.metrics.daemon_restarts.labels(mode="sm-sharing")._value.get() == restarts
    events = [e for e in kube.events.values() if e["reason"] == "MpsDaemonRestarted"]
    assert 1 <= len(events) <= restarts
    assert f"(restart {restarts})" in events[-1]["message"]
    for event in events:
        assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1",
                                           "uid": "gpu-node-1"}
    assert kube.last_condition("gpu-sharing.nvidia.com/Ready")["status"] == "True"
    agent.shutdown()


def test_a_missing_daemon_says_where_to_look(node):
    kube, config, supervisors = node
    supervisors[ComputeMode.TIME_SLICING].stop()
    agent = Agent(replace(config, startup_wait=0.1), kube, NvmlSource(), AgentMetrics())
    agent.start()
    agent.tick()
    condition = kube.last_condition()
    assert (condition["status"], condition["reason"]) == ("False", "MpsDaemonNotReady")
    assert "check the gpufrac-mps DaemonSet pod on this node" in condition["message"]
    agent.shutdown()


def test_the_status_file_round_trips_and_a_torn_one_reads_as_none(tmp_path: Path):
    from gpufrac.agent.decide.model import DaemonStatus
    status = DaemonStatus(ComputeMode.SM_SHARING, DaemonState.BACKOFF, False, 2, None, "exited with code 1", None)
    write_status(tmp_path, status)
    assert read_status(tmp_path, ComputeMode.SM_SHARING) == status
    (tmp_path / "supervisor.json").write_text('{"state": "runn')
    assert read_status(tmp_path, ComputeMode.SM_SHARING) is None


def test_gpufrac_mps_parses_its_flags():
    args = build_parser().parse_args(["mps", "--mode", "sm-sharing", "--restart-backoff", "2"])
    assert (args.mode, args.restart_backoff, args.quit_timeout) == (ComputeMode.SM_SHARING, 2.0, 60.0)


def test_an_mps_pod_on_another_build_is_a_version_skew_metric_and_condition_reason_until_it_matches(node):
    """After `helm upgrade` the OnDelete MPS pods keep their old image: the agent compares the build each `gpufrac
    mps` reports in its status file with its own (version and --image) and says so, without taking the node out."""
    kube, config, supervisors = node
    config = replace(config, image="registry.example.com/gpufrac:0.2.0")
    agent = Agent(config, kube, NvmlSource(), AgentMetrics())
    agent.start()
    own = build(config.image)
    old = build("registry.example.com/gpufrac:0.1.0")
    for supervisor in supervisors.values():
        write_status(supervisor.spec.log_dir, replace(supervisor.status(), build=own))
    sm = supervisors[ComputeMode.SM_SHARING]
    write_status(sm.spec.log_dir, replace(sm.status(), build=old))
    agent.tick()
    skew = agent.metrics.version_skew
    assert skew.labels(mode="sm-sharing")._value.get() == 1
    assert skew.labels(mode="time-slicing")._value.get() == 0
    for condition_type in ("gpufrac.io/Ready", "gpu-sharing.nvidia.com/Ready"):
        condition = kube.last_condition(condition_type)
        assert (condition["status"], condition["reason"]) == ("True", "MpsVersionSkew"), condition
        assert (f"the sm-sharing MPS pod runs gpufrac {old}, the agent gpufrac {own}: replace the node's MPS pod"
                in condition["message"]), condition["message"]
    write_status(sm.spec.log_dir, replace(sm.status(), build=own))  # the MPS pod replaced on the new image
    agent.tick()
    assert skew.labels(mode="sm-sharing")._value.get() == 0
    assert kube.last_condition()["reason"] == "FractionsEnforced"
    (sm.spec.log_dir / "supervisor.json").unlink()  # a `gpufrac mps` from before builds were reported
    agent.tick()
    assert skew.labels(mode="sm-sharing")._value.get() == 1
    assert "the sm-sharing MPS pod runs gpufrac unknown" in kube.last_condition()["message"]
    agent.shutdown()


def test_gpufrac_mps_reports_its_build_in_the_status_file(tmp_path: Path):
    from gpufrac.agent.decide.model import DaemonStatus
    from gpufrac.agent.programs.mps_service import _report
    _report(tmp_path, DaemonStatus(ComputeMode.SM_SHARING, DaemonState.RUNNING, True, 0, pid=7), "img:1")
    assert read_status(tmp_path, ComputeMode.SM_SHARING).build == f"{version()} (img:1)"
