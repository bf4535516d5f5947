"""Issue 30, the daemon side: the agent tells the sm-sharing MPS daemon each GPU's limits (decide.mps_limits,
programs.mps_limits), the fake daemon records them, and a client asking for more gets the daemon's value; a client
whose env names a GPU it cannot see gets none (issue 43: NVIDIA's measurement, which the fake follows)."""

from __future__ import annotations

from pathlib import Path

from e2e.toolkit.wait import wait_until
from gpufrac.agent.decide import mps_limits
from gpufrac.agent.decide.claim_tenants import ClaimTenants
from gpufrac.agent.decide.model import RunningContainer
from gpufrac.agent.decide.mps_namespaces import namespace_name
from gpufrac.agent.edges.mps_control import MpsControlError, send
from gpufrac.agent.edges.nvml import NvmlSource
from gpufrac.agent.edges.supervisor import MpsSupervisor
from gpufrac.agent.node.compute_modes import ComputeModes
from gpufrac.agent.node.mps_limits import CREATED_TTL_S, DaemonSideLimits
from gpufrac.agent.node.node_loop import Agent
from gpufrac.core.annotations import ComputeMode
from testkit.agent import UUID_A, UUID_B, FakeNode, canonical_annotations, cid, container, gpu_info, placing, pod
from testkit.fakes.mps_client import ClientLimits, connect, connect_without_pipe, records
from testkit.fakes.state import FakeGpuState

SM = ComputeMode.SM_SHARING
GPUS = (gpu_info(0, UUID_A), gpu_info(1, UUID_B))
PINNED, THREADS = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


def sm(name: str, limit: int, device: str = UUID_A, threads: int | None = 50) -> RunningContainer:
    return container(name, pod=f"p-{name}", mode=SM, request_mib=limit, limit_mib=limit, devices=(device,),
                     active_thread_percent=threads)


# ---- the plan (pure) ----

def test_the_plan_holds_each_gpu_to_its_fractions_and_says_where_one_limit_stands_for_several() -> None:
    equal = mps_limits.plan([sm("a", 4096), sm("b", 4096), sm("c", 8192, UUID_B, threads=30)], GPUS)
    assert equal.default_commands() == [f"set_default_device_pinned_mem_limit {UUID_A} 4096M",
                                        f"set_default_device_pinned_mem_limit {UUID_B} 8192M",
                                        "set_default_active_thread_percentage 50"]
    assert equal.server_commands([7]) == [f"set_device_pinned_mem_limit 7 {UUID_A} 4096M",
                                          f"set_device_pinned_mem_limit 7 {UUID_B} 8192M",
                                          "set_active_thread_percentage 7 50"]
    assert "threads are held to 50%, the largest of" in (mps_limits.holds(equal, applied=True) or "")
    same = mps_limits.plan([sm("a", 4096), sm("b", 4096)], GPUS)
    assert mps_limits.holds(same, applied=True) is None
    mixed = mps_limits.plan([sm("a", 4096), sm("b", 12288)], GPUS)
    message = mps_limits.holds(mixed, applied=True) or ""
    assert f"GPU {UUID_A} holds clients to 12288Mi, the largest of team-a/p-a/a 4096Mi, team-a/p-b/b 12288Mi" in message
    assert "did not take" in (mps_limits.holds(same, applied=False) or "")


def test_time_slicing_and_unbound_fractions_are_not_the_sm_daemons() -> None:
    ts = container("t", mode=ComputeMode.TIME_SLICING, devices=(UUID_A,))
    assert mps_limits.plan([ts], GPUS) == mps_limits.DaemonPlan((), None, {}, ())
    by_index = mps_limits.plan([sm("a", 4096, "1"), sm("x", 4096, "GPU-gone")], GPUS)
    assert [c.uuid for c in by_index.ceilings] == [UUID_B]
    assert by_index.unknown_devices == ("GPU-gone",)


# ---- against the fake daemon ----

def test_the_daemon_side_holds_each_containers_limits_and_a_client_asking_more_gets_the_daemons(
        daemon: MpsSupervisor) -> None:
    limits = DaemonSideLimits(daemon.spec.argv[0], daemon.spec.pipe_dir)
    limits.apply([sm("a", 4096), sm("b", 4096)], GPUS)
    assert limits.problem is None
    told = records(daemon.spec.log_dir, "limit")
    assert told[-1]["defaults"] == {"pinned": {UUID_A: 4096}, "threads": 50}

    pipe = daemon.spec.pipe_dir
    assert connect(pipe, UUID_A, env={PINNED: f"{UUID_A}=81920M", THREADS: "100"}).pinned_mib == 4096
    assert connect(pipe, UUID_A, env={PINNED: f"{UUID_A}=81920M", THREADS: "100"}).thread_percent == 50
    assert connect(pipe, UUID_A, env={}).pinned_mib == 4096  # `env -i`: the daemon's value still holds
    # an env naming a GPU the client cannot see (an index past its view, a UUID not in it) loses EVERY pinned limit,
    # the daemon side's included (NVIDIA's measurement on 615.71.09: 96,768 MiB under a 10G server limit); the
    # thread cap survives. The daemon side alone does not close this row: the cgroup limit does (test_hard_limit).
    assert connect(pipe, UUID_A, visible=(UUID_A,), env={PINNED: "0=2048M,1=2048M"}) == ClientLimits(None, 50)
    assert connect(pipe, UUID_A, env={PINNED: f"{UUID_A}=2048M,{UUID_B}=2048M"}) == ClientLimits(None, 50)
    assert connect(pipe, UUID_A, env={PINNED: "GPU-bogus=2048M"}).pinned_mib is None
    # the env lowers, never raises
    assert connect(pipe, UUID_A, env={PINNED: f"{UUID_A}=2048M", THREADS: "20"}) == ClientLimits(2048, 20)
    clients = records(daemon.spec.log_dir, "client")
    assert clients[0] == {**clients[0], "asked": 81920, "held": 4096, "got": 4096}


def test_without_the_daemon_side_a_client_without_env_has_the_whole_gpu(daemon: MpsSupervisor) -> None:
    """The control: what row 2 (env dropped) and row 3 (narrowed view) get where only the env carries the limit."""
    pipe = daemon.spec.pipe_dir
    assert connect(pipe, UUID_A, env={}).pinned_mib is None
    assert connect(pipe, UUID_A, visible=(UUID_A,), env={PINNED: "0=2048M,1=2048M"}).pinned_mib is None


def test_a_running_server_is_told_by_pid_when_the_fractions_change(daemon: MpsSupervisor) -> None:
    limits = DaemonSideLimits(daemon.spec.argv[0], daemon.spec.pipe_dir)
    limits.apply([sm("a", 4096)], GPUS)
    assert connect(daemon.spec.pipe_dir, UUID_A).pinned_mib == 4096  # spawns the server with the defaults
    limits.apply([sm("a", 4096), sm("b", 6144, UUID_B)], GPUS)
    told = records(daemon.spec.log_dir, "limit")[-1]
    (server,) = told["servers"].values()
    assert server["pinned"] == {UUID_A: 4096, UUID_B: 6144}
    assert connect(daemon.spec.pipe_dir, UUID_B, env={PINNED: f"{UUID_B}=81920M"}).pinned_mib == 6144
    before = len(records(daemon.spec.log_dir, "command"))
    limits.apply([sm("a", 4096), sm("b", 6144, UUID_B)], GPUS)  # nothing changed: only the server list is asked
    assert [r["command"] for r in records(daemon.spec.log_dir, "command")[before:]] == ["get_server_list"]


def test_a_daemon_that_is_not_there_is_a_problem_for_the_condition(tmp_path: Path, mps_binary: str) -> None:
    limits = DaemonSideLimits(mps_binary, tmp_path / "nowhere")
    limits.apply([sm("a", 4096)], GPUS)
    assert limits.problem is not None and "did not take its limits" in limits.problem
    assert "Cannot find MPS control daemon" in limits.problem


def test_a_restarted_daemon_is_told_again(daemon: MpsSupervisor) -> None:
    limits = DaemonSideLimits(daemon.spec.argv[0], daemon.spec.pipe_dir)
    limits.apply([sm("a", 4096)], GPUS)
    first = daemon.pid
    crash = daemon.spec.log_dir / "fake-crash"
    crash.touch()
    wait_until(lambda: daemon.status().restarts >= 1, timeout=10, what="the fake daemon to crash")
    crash.unlink()
    wait_until(lambda: daemon.status().up and daemon.pid != first, timeout=10, what="the restarted daemon")

    def default_limit() -> str | None:
        try:
            return send(daemon.spec.argv[0], daemon.spec.pipe_dir, f"get_default_device_pinned_mem_limit {UUID_A}")
        except MpsControlError:
            return None  # a daemon started while the crash flag was still there crashed again: asked once more

    assert wait_until(default_limit, timeout=10, what="the restarted daemon's answer") == "0"  # it forgot them
    limits.apply([sm("a", 4096)], GPUS)
    assert connect(daemon.spec.pipe_dir, UUID_A, env={PINNED: f"{UUID_A}=81920M"}).pinned_mib == 4096


def test_a_fraction_held_at_its_creation_counts_until_the_pod_watch_has_it(daemon: MpsSupervisor) -> None:
    """The NRI plugin tells the daemon a fraction being created (its pod may not be in the watch yet): the next
    passes keep its limit until the node's pods include it, or CREATED_TTL_S."""
    now = [0.0]
    limits = DaemonSideLimits(daemon.spec.argv[0], daemon.spec.pipe_dir, clock=lambda: now[0])
    assert limits.hold([sm("a", 4096)], GPUS, [sm("new", 6144, UUID_B)], 30.0) is None
    assert records(daemon.spec.log_dir, "limit")[-1]["defaults"]["pinned"] == {UUID_A: 4096, UUID_B: 6144}
    assert connect(daemon.spec.pipe_dir, UUID_B, env={}).pinned_mib == 6144
    kept = limits.apply([sm("a", 4096)], GPUS)  # the loop's pass, its pod not watched yet
    assert [c.uuid for c in kept.ceilings] == [UUID_A, UUID_B]
    now[0] += CREATED_TTL_S + 1  # never watched (deleted at once, say): no longer held for it
    assert [c.uuid for c in limits.apply([sm("a", 4096)], GPUS).ceilings] == [UUID_A]

    limits.hold([sm("a", 4096)], GPUS, [sm("new", 6144, UUID_B)], 30.0)
    limits.apply([sm("a", 4096), sm("new", 6144, UUID_B)], GPUS)  # watched: its pod's record stands for it
    assert [c.uuid for c in limits.apply([sm("a", 4096)], GPUS).ceilings] == [UUID_A]  # and goes with it


def test_telling_the_daemon_within_a_deadline_fails_rather_than_overrun_it(daemon: MpsSupervisor) -> None:
    limits = DaemonSideLimits(daemon.spec.argv[0], daemon.spec.pipe_dir)
    failed = limits.hold([sm("a", 4096)], GPUS, (), 0.0)
    assert failed is not None and "no time left" in failed
    assert "did not take its limits" in (limits.problem or "")
    assert limits.hold([sm("a", 4096)], GPUS, (), 30.0) is None
    before = len(records(daemon.spec.log_dir, "command"))
    assert limits.hold([sm("a", 4096)], GPUS, (), 1.0) is None  # a creation that changes nothing: no command
    assert records(daemon.spec.log_dir, "command")[before:] == []


def test_a_creation_waits_for_a_pass_under_way_no_longer_than_its_deadline(daemon: MpsSupervisor) -> None:
    limits = DaemonSideLimits(daemon.spec.argv[0], daemon.spec.pipe_dir)
    with limits._lock:  # a pass telling a wedged daemon
        failed = limits.hold([sm("a", 4096)], GPUS, (), 0.2)
    assert failed == "the agent's pass was still telling the MPS daemon its limits after 0.2 s"


# ---- the agent's loop tells the daemon ----

def _ticked_with_daemon(node: FakeNode) -> Agent:
    """An agent started on the node, ticked once its sm-sharing daemon is up (the tick that tells it)."""
    agent = node.start_agent()
    agent.tick()
    wait_until(lambda: agent.daemon_statuses()[SM].up, timeout=10, what="the sm-sharing daemon")
    agent.tick()
    return agent


def _sm_pipe_and_log(node: FakeNode) -> tuple[Path, Path]:
    return node.tmp / "mps" / str(SM), node.tmp / "log" / str(SM)


def test_each_tick_holds_the_placed_sm_sharing_fractions_on_the_daemon_side(fake_node: FakeNode) -> None:
    """The node's `infer` pod (sm-sharing, limit 16000 MiB on GPU B): the agent's loop tells the daemon, and a client
    of GPU B whose env asks for the whole GPU, or carries none, gets 16000 MiB."""
    _ticked_with_daemon(fake_node)
    pipe, log_dir = _sm_pipe_and_log(fake_node)
    assert records(log_dir, "limit")[-1]["defaults"] == {"pinned": {UUID_B: 16000}, "threads": 100}
    assert connect(pipe, UUID_B, env={PINNED: f"{UUID_B}=80000M"}).pinned_mib == 16000
    assert connect(pipe, UUID_B, env={}).pinned_mib == 16000
    assert connect(pipe, UUID_A, env={}).pinned_mib is None  # GPU A: the time-slicing `train` pod's, not this daemon's
    condition = fake_node.kube.last_condition()
    assert condition["reason"] == "FractionsEnforced" and "MPS daemon holds" not in condition["message"], condition


def _two_limits_on_gpu_b(node: FakeNode) -> None:
    """A second sm-sharing pod on GPU B with a larger limit than `infer`'s, bound but not started yet."""
    annotations = canonical_annotations("worker", request_mib=20000, limit_mib=30000, devices=[UUID_B],
                                        mode="sm-sharing")
    started = pod("infer-2", uid="u-infer-2", containers={"worker": cid(3)}, annotations=annotations)
    started["status"]["containerStatuses"] = []  # bound, its container not created yet
    node.kube.pods.append(started)


def test_fractions_of_one_gpu_with_different_limits_are_said_on_the_condition_on_a_legacy_driver(
        fake_node: FakeNode) -> None:
    """Before r615 (no MPS v3 namespaces): the daemon holds GPU B's clients to the larger limit before the new
    container's process connects, and the condition says which container rests on its env and the agent's total."""
    fake_node.gpus.set(driver_version="550.54.15", cuda_driver_version=12040)
    _two_limits_on_gpu_b(fake_node)
    _ticked_with_daemon(fake_node)
    _, log_dir = _sm_pipe_and_log(fake_node)
    assert records(log_dir, "limit")[-1]["defaults"]["pinned"] == {UUID_B: 30000}
    assert records(log_dir, "namespace") == []
    message = fake_node.kube.last_condition()["message"]
    assert (f"GPU {UUID_B} holds clients to 30000Mi, the largest of team-a/infer-2/worker 30000Mi, "
            "team-a/infer/worker 16000Mi") in message, message
    assert "MPS v3 namespaces per container, on r615+ drivers, would hold it" in message


def test_on_mps_v3_each_fraction_of_one_gpu_is_held_to_its_own_limit_by_its_namespace(fake_node: FakeNode) -> None:
    """r615 (the fake's default): the same two fractions each get a namespace of their own with their own limit, and
    the condition has no gap to say."""
    _two_limits_on_gpu_b(fake_node)
    agent = _ticked_with_daemon(fake_node)
    _, log_dir = _sm_pipe_and_log(fake_node)
    held = {r["namespace"]: r["pinned"] for r in records(log_dir, "namespace") if r["verb"] == "set"}
    assert held == {namespace_name("u-infer", "worker"): 16000, namespace_name("u-infer-2", "worker"): 30000}
    route = agent.pipe_route("u-infer", "worker")
    assert route is not None
    assert connect(route, UUID_B, env={PINNED: f"{UUID_B}=80000M"}).pinned_mib == 16000
    assert connect(route, UUID_B, env={}).pinned_mib == 16000  # the server holds 30000: the namespace, 16000
    message = fake_node.kube.last_condition()["message"]
    assert "holds clients to" not in message and "did not take" not in message, message


def test_the_dra_drivers_shares_are_held_like_annotated_fractions(fake_node: FakeNode) -> None:
    """A prepared sm-sharing claim on GPU A (the DRA driver hands the loop its shares as fractions) beside the
    annotated `infer` pod on GPU B: the daemon holds both GPUs."""
    agent = fake_node.start_agent(doors=[placing(ClaimTenants((sm("claim-a", 12288, UUID_A, threads=40),)))])
    agent.tick()
    wait_until(lambda: agent.daemon_statuses()[SM].up, timeout=10, what="the sm-sharing daemon")
    agent.tick()
    pipe, log_dir = _sm_pipe_and_log(fake_node)
    assert records(log_dir, "limit")[-1]["defaults"] == {"pinned": {UUID_A: 12288, UUID_B: 16000}, "threads": 100}
    assert connect(pipe, UUID_A, env={}).pinned_mib == 12288


# ---- issue 43: the MPS bypass closed (decide.compute_modes, programs.compute_modes) ----

def test_a_client_without_its_pipe_directory_gets_no_context_on_an_sm_sharing_gpu(fake_node: FakeNode) -> None:
    """`env -i` in the sm-sharing `infer` container (GPU B): an ordinary CUDA process, which in the DEFAULT compute
    mode gets the whole GPU. The agent holds GPU B in EXCLUSIVE_PROCESS, where it gets no context; GPU A (the
    time-slicing `train` pod's) keeps its mode; once no sm-sharing fraction is placed on GPU B, its mode comes back."""
    assert connect_without_pipe(UUID_B) == ClientLimits(None, 100)  # the control: DEFAULT mode, the whole GPU
    agent = _ticked_with_daemon(fake_node)
    assert connect_without_pipe(UUID_B) is None
    assert connect_without_pipe(UUID_A) == ClientLimits(None, 100)
    assert agent.compute_modes is not None and agent.compute_modes.problem is None


def test_a_gpu_that_no_longer_serves_sm_sharing_gets_its_compute_mode_back(fake_gpus: FakeGpuState) -> None:
    fake_gpus.gpu(UUID_A).gpu(UUID_B)
    modes = ComputeModes(NvmlSource())
    assert modes.apply([sm("a", 4096), sm("b", 4096, "1")], GPUS) is None
    assert (fake_gpus.compute_mode(UUID_A), fake_gpus.compute_mode(UUID_B)) == (3, 3)
    assert modes.apply([sm("b", 4096, "1")], GPUS) is None  # the mode left GPU A
    assert (fake_gpus.compute_mode(UUID_A), fake_gpus.compute_mode(UUID_B)) == (0, 3)
    assert connect_without_pipe(UUID_A) == ClientLimits(None, 100)
    fake_gpus.set(error={"function": "nvmlDeviceSetComputeMode", "code": 4})  # NVML_ERROR_NO_PERMISSION
    problem = modes.apply([sm("a", 4096)], GPUS) or ""
    assert f"GPU {UUID_A} serves sm-sharing but its compute mode is not EXCLUSIVE_PROCESS" in problem, problem
