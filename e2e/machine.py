"""The machine's one real node: the lock a node holds for its lifetime, and putting the machine back after it
(container processes and shims with their sockets, mounts, kubepods cgroups, the network namespace, the fake GPU
device nodes, sysctls, the machine-wide paths the node created).

It knows nothing of the cluster classes: `e2e.node` takes the lock and cleans up on `stop()`, `e2e.state` cleans up
after a node whose owner is gone (`python -m e2e down`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from e2e.names import NODE_ROOT
from e2e.toolkit import gpu_devices, sysctls
from e2e.toolkit.containerd import SHIM_SOCKET_DIR
from e2e.toolkit.errors import ClusterError
from e2e.toolkit.netns import NodeNetwork
from e2e.toolkit.procs import Proc, process_stats, spawn

LOCK_FILE = "/tmp/gpufrac-real-node.lock"


def take_lock(workdir: Path, detach: bool) -> Proc:
    """The machine's one real node: this process takes the flock (waiting up to $GPUFRAC_NODE_LOCK_WAIT
    seconds for another node to go), then hands it to a `sleep infinity` child that holds it as long as
    the node lives (a flock belongs to the open file, which the child inherits). Returns that child."""
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        wait = float(os.environ.get("GPUFRAC_NODE_LOCK_WAIT", "0"))
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ClusterError(
                        f"another real node holds {LOCK_FILE} (pids {lock_holders()}): one "
                        "real node per machine; stop it with `make cluster-down`, or set "
                        "GPUFRAC_NODE_LOCK_WAIT=<seconds> to wait for it") from None
                time.sleep(1)
        return spawn("node-lock", ["sleep", "infinity"], workdir / "node-lock.log", pass_fds=(fd,),
                     die_with_parent_signal=None if detach else signal.SIGKILL)
    finally:
        os.close(fd)


def _kubepods_cgroups() -> list[Path]:
    """Every kubepods cgroup directory in every v1 hierarchy (and the v2 one), deepest first."""
    found: list[Path] = []
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        for top in (hierarchy / "kubepods", hierarchy / "kubepods.slice"):
            if top.is_dir():
                found += [Path(dirpath) for dirpath, _, _ in os.walk(top)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _kill_cgroup_members(cgroups: list[Path]) -> int:
    killed = 0
    for cg in cgroups:
        with contextlib.suppress(OSError):
            for pid in (cg / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)
                    killed += 1
    return killed


def _shim_sockets(pid: int) -> list[str]:
    """The sockets under containerd's machine-wide shim directory that process `pid` has open (its listening
    socket: /proc/<pid>/net/unix lists its network namespace's sockets by inode)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:["):-1])
    paths = []
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and fields[6] in inodes and fields[7].startswith(SHIM_SOCKET_DIR + "/"):
                paths.append(fields[7])
    return paths


def _kill_shims(node_root: Path) -> list[str]:
    """SIGKILL the node's shims; returns the sockets they listened on (a killed shim leaves its socket)."""
    sockets = []
    for pid, _ in process_stats():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "containerd-shim" in cmdline and str(node_root) in cmdline:
            sockets += _shim_sockets(pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return sockets


def _unmount_under(root: Path) -> None:
    prefix = str(root).rstrip("/") + "/"
    for _ in range(5):
        mounts = [line.split()[1].encode().decode("unicode_escape") for line in
                  Path("/proc/mounts").read_text().splitlines()]
        under = [m for m in mounts if m == str(root) or m.startswith(prefix)]
        if not under:
            return
        for mount in sorted(under, key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)


def lock_holders() -> str:
    """The pids holding the machine's lock, as fuser lists them ('?' when it cannot tell)."""
    return subprocess.run(["fuser", LOCK_FILE], capture_output=True, text=True).stdout.strip() or "?"


def machine_is_free() -> bool:
    """No real node holds the machine's lock now (a probe from an open file of its own, let go at once)."""
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def clean_orphan(workdir: Path, state: dict) -> None:
    """What a node whose owner is gone left on the machine goes, but only while the machine is still that
    node's: its lock holder still runs, or nobody holds the lock (taken for the cleanup). Another live node
    holding it means the namespace, cgroups and mounts are that node's now: tearing them down broke it (seen:
    one clone's `e2e down` of its crashed node cut a running node's apiserver off its own address)."""
    lock = state.get("lock")
    if lock and Proc.from_json("node-lock", lock).alive():
        clean_machine(workdir, state)
        return
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"[e2e] {workdir}: left the machine's node state alone: another real node holds {LOCK_FILE} "
                  f"(pids {lock_holders()}) and owns it now")
            return
        clean_machine(workdir, state)
    finally:
        os.close(fd)


def clean_machine(workdir: Path, state: dict, quiet: bool = False) -> None:
    """Everything a real node left on the machine goes: container processes and shims (and their sockets),
    mounts under its root (with containerd's state, the NRI socket and the CDI specs), kubepods cgroups, its
    network namespace, the fake GPU device nodes, the machine-wide paths it created; the sysctls come back; the
    lock goes last. Safe to run twice, and on a machine where no node ever ran."""
    node_root = Path(state.get("node_root") or NODE_ROOT)
    cgroups = _kubepods_cgroups()
    for _ in range(20):
        if not _kill_cgroup_members(cgroups):
            break
        time.sleep(0.1)
    for sock in _kill_shims(node_root):
        with contextlib.suppress(OSError):
            os.unlink(sock)
    _unmount_under(node_root)
    for cg in _kubepods_cgroups():
        with contextlib.suppress(OSError):
            cg.rmdir()
    NodeNetwork().destroy()
    gpu_devices.remove()
    changed = sysctls.restore(state.get("sysctls") or {})
    if changed and not quiet:
        print(f"[e2e] restored sysctls the node had changed: {changed}")
    for path in state.get("created_paths") or ():
        with contextlib.suppress(OSError):
            if os.path.islink(path) or os.path.isfile(path):
                os.unlink(path)
            else:
                shutil.rmtree(path)
    if node_root.exists():
        shutil.rmtree(node_root, ignore_errors=True)
    lock = state.get("lock")
    if lock:
        Proc.from_json("node-lock", lock).stop()
