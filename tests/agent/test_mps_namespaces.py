"""Issue 30, limits a process cannot raise: one MPS v3 namespace per sm-sharing container (decide.mps_namespaces,
programs.mps_limits), against the fake daemon, which routes a client by the namespace socket it connects to."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

from e2e.toolkit.wait import wait_until
from gpufrac.agent.decide import mps_namespaces
from gpufrac.agent.decide.model import RunningContainer
from gpufrac.agent.decide.mps_namespaces import Namespace, changes, claim_namespace_name, namespace_name, wanted
from gpufrac.agent.edges.mps_control import invoke
from gpufrac.agent.edges.supervisor import MpsSupervisor
from gpufrac.agent.node.mps_limits import FORCE_AFTER_S, DaemonSideLimits
from gpufrac.core.annotations import ComputeMode
from testkit.agent import UUID_A, container, gpu_info
from testkit.fakes.mps_client import ClientLimits, attached, connect, records

SM = ComputeMode.SM_SHARING
GPUS = (gpu_info(0, UUID_A),)
PINNED = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"


def sm(name: str, limit: int, threads: int | None = 50, claim: str = "") -> RunningContainer:
    return replace(container(name, pod=f"p-{name}", uid=f"u-{name}", mode=SM, request_mib=limit, limit_mib=limit,
                             devices=(UUID_A,), active_thread_percent=threads), claim=claim)


# ---- pure ----

def test_a_containers_namespace_is_named_from_its_pod_uid_and_name_short_enough_for_a_socket_path() -> None:
    name = namespace_name("0b6f-uid", "app")
    assert name == namespace_name("0b6f-uid", "app") != namespace_name("0b6f-uid", "sidecar")
    assert len(name) == 13 and mps_namespaces.is_ours(name)
    assert not mps_namespaces.is_ours("training") and not mps_namespaces.is_ours(name + "0")
    assert mps_namespaces.listed(f"{name},4096,50\ntraining,,\ndefault,,\n") == {name}  # --format=csv,noheader
    assert mps_namespaces.listed(f"{name}\ntraining\n\n{namespace_name('x', 'y')} 3 clients\n") == {
        name, namespace_name("x", "y")}


def test_only_sm_sharing_fractions_and_claims_with_a_limit_get_a_namespace() -> None:
    time_slicing = container("t", uid="u-t", mode=ComputeMode.TIME_SLICING, devices=(UUID_A,))
    no_limit = container("n", uid="u-n", mode=SM, request_mib=100, limit_mib=None, devices=(UUID_A,))
    got = wanted([sm("a", 4096, threads=None), time_slicing, no_limit, sm("c", 2048, claim="claim-c/gpu")])
    # a claim's is named from the claim (Prepare mounts it before any of its pods' containers exists)
    claim = claim_namespace_name("team-a", "claim-c/gpu")
    assert claim != namespace_name("u-c", "c")
    assert got == {namespace_name("u-a", "a"): Namespace(namespace_name("u-a", "a"), 4096, 100, "team-a/p-a/a"),
                   claim: Namespace(claim, 2048, 50, "team-a/p-c/c")}


def test_the_changes_create_set_and_delete_only_what_differs() -> None:
    a, b = Namespace("c000000000001", 4096, 50, "x/a/a"), Namespace("c000000000002", 2048, 30, "x/b/b")
    todo = changes({"c000000000001": None, "c00000000000f": a}, {a.name: a, b.name: b})
    assert todo.commands() == [
        ("namespace", "delete", "c00000000000f", "--server=gpufrac"),
        ("namespace", "create", "c000000000002", "--server=gpufrac"),
        ("namespace", "set", "c000000000002", "--server=gpufrac", "--pinned-memory-limit=2048M",
         "--active-thread-percentage=30"),
        ("namespace", "set", "c000000000001", "--server=gpufrac", "--pinned-memory-limit=4096M",
         "--active-thread-percentage=50"),
    ]
    assert changes({a.name: a}, {a.name: a}).commands() == []


# ---- against the fake daemon ----

def test_each_container_is_held_to_its_own_limit_where_the_server_holds_the_largest(daemon: MpsSupervisor) -> None:
    """The control first: without namespaces, a client of the 4096 MiB container that drops its env gets the
    server's 12288 MiB (its larger neighbour's). With them, it gets its own, whatever its env asks."""
    pipe = daemon.spec.pipe_dir
    limits = DaemonSideLimits(daemon.spec.argv[0], pipe)
    limits.apply([sm("a", 4096), sm("b", 12288, threads=80)], GPUS)
    assert limits.route("u-a", "a") is None
    assert connect(pipe, UUID_A, env={}).pinned_mib == 12288
    assert "holds clients to 12288Mi" in (limits.problem or "")

    limits.apply([sm("a", 4096), sm("b", 12288, threads=80)], GPUS, namespaces=True)
    assert limits.problem is None
    own = limits.route("u-a", "a")
    assert own == pipe / "gpufrac" / namespace_name("u-a", "a")
    assert connect(own, UUID_A, env={}).pinned_mib == 4096
    assert connect(own, UUID_A, env={PINNED: f"{UUID_A}=81920M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}) \
        .thread_percent == 50
    other = limits.route("u-b", "b")
    assert other is not None and connect(other, UUID_A, env={}).pinned_mib == 12288
    # what its processes can reach: their namespace's socket, no control socket of the daemon's
    assert sorted(p.name for p in own.iterdir()) == ["control", "fake-context-share", "fake-server-limits"]
    raised = subprocess.run([daemon.spec.argv[0]], input=f"set_default_device_pinned_mem_limit {UUID_A} 81920M\n",
                            capture_output=True, text=True, env={"CUDA_MPS_PIPE_DIRECTORY": str(own)}, check=False)
    assert raised.stdout.startswith("Error: a namespace's socket serves clients")


def test_a_namespace_goes_with_its_container_and_a_new_agent_clears_its_own_leftovers(daemon: MpsSupervisor) -> None:
    pipe, binary = daemon.spec.pipe_dir, daemon.spec.argv[0]
    limits = DaemonSideLimits(binary, pipe)
    limits.apply([sm("a", 4096), sm("b", 2048)], GPUS, namespaces=True)
    gone = limits.route("u-b", "b")
    assert gone is not None and gone.exists()
    limits.apply([sm("a", 4096)], GPUS, namespaces=True)
    assert not gone.exists() and limits.route("u-b", "b") is None

    invoke(binary, pipe, ("namespace", "create", "training", "--server=gpufrac"))  # not ours: left alone
    invoke(binary, pipe, ("namespace", "create", namespace_name("u-old", "app"), "--server=gpufrac"))
    restarted = DaemonSideLimits(binary, pipe)  # a restarted agent: lists what the daemon has
    restarted.apply([sm("a", 4096)], GPUS, namespaces=True)
    listed = [line.split(",")[0] for line in invoke(binary, pipe, mps_namespaces.list_command()).splitlines()]
    assert sorted(listed) == sorted([namespace_name("u-a", "a"), "training", "default"])  # the server's own
    before = len(records(daemon.spec.log_dir, "command"))
    restarted.apply([sm("a", 4096)], GPUS, namespaces=True)  # nothing changed: no namespace command
    assert not any(r["command"].startswith("namespace") for r in records(daemon.spec.log_dir, "command")[before:])


def test_a_restarted_daemon_gets_its_namespaces_again(daemon: MpsSupervisor) -> None:
    limits = DaemonSideLimits(daemon.spec.argv[0], daemon.spec.pipe_dir)
    limits.apply([sm("a", 4096)], GPUS, namespaces=True)
    bound = limits.route("u-a", "a")
    assert bound is not None
    inode = bound.stat().st_ino  # what a container's bind mount holds: the directory, not its path
    first = daemon.pid
    crash = daemon.spec.log_dir / "fake-crash"
    crash.touch()
    wait_until(lambda: daemon.status().restarts >= 1, timeout=10, what="the fake daemon to crash")
    crash.unlink()
    wait_until(lambda: daemon.status().up and daemon.pid != first, timeout=10, what="the restarted daemon")

    def held() -> bool:
        limits.apply([sm("a", 4096)], GPUS, namespaces=True)
        own = limits.route("u-a", "a")
        return own is not None and connect(own, UUID_A, env={}).pinned_mib == 4096

    assert wait_until(held, timeout=10, what="the namespace on the new daemon")
    assert limits.route("u-a", "a") == bound and bound.stat().st_ino == inode


def test_a_creation_is_answered_only_once_its_namespace_holds_it(daemon: MpsSupervisor) -> None:
    limits = DaemonSideLimits(daemon.spec.argv[0], daemon.spec.pipe_dir)
    assert limits.hold([sm("a", 4096)], GPUS, [sm("new", 2048)], 30.0, namespaces=True) is None
    own = limits.route("u-new", "new")
    assert own is not None and connect(own, UUID_A, env={}).pinned_mib == 2048
    failed = limits.hold([sm("a", 4096)], GPUS, [sm("late", 1024)], 0.0, namespaces=True)
    assert failed is not None and "no time left" in failed
    assert limits.route("u-late", "late") is None


def test_a_pipe_directory_too_long_for_namespace_sockets_is_said_and_the_server_limits_stay(
        tmp_path: Path, mps_binary: str) -> None:
    long_dir = "/run/" + "x" * 80
    assert mps_namespaces.too_long("/run/gpufrac/mps/sm-sharing") is None
    assert "longer than a unix socket's 107 bytes" in (mps_namespaces.too_long(long_dir) or "")
    limits = DaemonSideLimits(mps_binary, Path(long_dir))
    limits.apply([sm("a", 4096)], GPUS, namespaces=True)  # no daemon there: the server commands fail, said first
    assert limits.route("u-a", "a") is None and "did not take its limits" in (limits.problem or "")


def test_a_terminating_sm_sharing_pod_refuses_no_new_creation(daemon: MpsSupervisor) -> None:
    """Issue 43: `namespace delete` fails while clients are attached (NVIDIA's MPS v3 Namespaces). A pod whose
    container left the node's fractions but whose process is still attached (its grace period) does not block the
    next sm-sharing creation; its namespace stays until its clients go, and is deleted with --force after
    FORCE_AFTER_S."""
    now = [0.0]
    pipe, binary = daemon.spec.pipe_dir, daemon.spec.argv[0]
    limits = DaemonSideLimits(binary, pipe, clock=lambda: now[0])
    limits.apply([sm("a", 4096), sm("old", 2048)], GPUS, namespaces=True)
    leaving = limits.route("u-old", "old")
    assert leaving is not None
    with attached(leaving):
        assert limits.hold([sm("a", 4096)], GPUS, [sm("new", 2048)], 30.0, namespaces=True) is None
        assert limits.route("u-new", "new") is not None
        limits.apply([sm("a", 4096), sm("new", 2048)], GPUS, namespaces=True)  # the pass: delete refused, not fatal
        assert limits.problem is None and leaving.exists()
        assert connect(leaving, UUID_A, env={}).pinned_mib == 2048  # still held while it runs
        now[0] += FORCE_AFTER_S
        limits.apply([sm("a", 4096), sm("new", 2048)], GPUS, namespaces=True)
        assert not leaving.exists()
    deletes = [c["command"] for c in records(daemon.spec.log_dir, "command") if "namespace delete" in c["command"]]
    assert deletes[-1].endswith("--force") and not deletes[0].endswith("--force")


def test_a_restarted_agent_does_not_set_again_the_namespaces_it_finds_with_their_clients_running(
        daemon: MpsSupervisor) -> None:
    """Issue 43: `namespace set` fails with clients attached on 615 (KAI's observation; the fake refuses it). A new
    agent finds its former self's namespaces and does not set them again: its pass and the next creation go on."""
    pipe, binary = daemon.spec.pipe_dir, daemon.spec.argv[0]
    DaemonSideLimits(binary, pipe).apply([sm("a", 4096)], GPUS, namespaces=True)
    restarted = DaemonSideLimits(binary, pipe)
    own = pipe / "gpufrac" / namespace_name("u-a", "a")
    with attached(own):
        before = len(records(daemon.spec.log_dir, "command"))
        restarted.apply([sm("a", 4096)], GPUS, namespaces=True)
        assert restarted.problem is None and restarted.failure is None
        assert restarted.hold([sm("a", 4096)], GPUS, [sm("new", 2048)], 30.0, namespaces=True) is None
        sent = [c["command"] for c in records(daemon.spec.log_dir, "command")[before:]]
        assert not any(c.startswith(f"namespace set {namespace_name('u-a', 'a')}") for c in sent), sent
        assert connect(own, UUID_A, env={}).pinned_mib == 4096


def test_the_servers_default_namespace_gives_no_more_than_the_largest_fraction(daemon: MpsSupervisor) -> None:
    """NVIDIA's MPS v3 Interface: a named server's `default` namespace (and any without limits) gives the whole GPU
    unless `server set` limits the server. A client reaching it (a DRA share mounts the whole pipe directory) is held
    to the largest sm-sharing fraction's limit."""
    pipe = daemon.spec.pipe_dir
    default = pipe / "gpufrac" / "default"
    assert connect(default, UUID_A, env={}).pinned_mib is None  # the control: nothing told yet, the whole GPU
    limits = DaemonSideLimits(daemon.spec.argv[0], pipe)
    limits.apply([sm("a", 4096), sm("b", 12288, threads=80)], GPUS, namespaces=True)
    assert connect(default, UUID_A, env={}) == ClientLimits(12288, 80)
    assert connect(limits.route("u-a", "a") or pipe, UUID_A, env={}).pinned_mib == 4096
