"""Reading GPU processes' /proc entries (edge); what their text says is parsed in `decide.proc_text` (pure).

The proc root is configurable: the agent runs with hostPID and reads the host's /proc; tests lay out
`<root>/<pid>/cgroup` and `<root>/<pid>/environ`.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

from gpufrac.agent.decide.errors import ProcReadError
from gpufrac.agent.decide.proc_text import container_ids_in_cgroup, parse_environ
from gpufrac.core.contract import LimitEnv


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise ProcReadError(f"reading {path}: {err.strerror or err}") from err


def read_cgroup(proc_root: Path, pid: int) -> str:
    return _read(proc_root / str(pid) / "cgroup").decode(errors="replace")


def read_environ(proc_root: Path, pid: int) -> dict[str, str]:
    return parse_environ(_read(proc_root / str(pid) / "environ"))


def read_start_time(proc_root: Path, pid: int) -> int:
    """When a process started, in clock ticks since boot (/proc/<pid>/stat, field 22): a PID's identity over time."""
    text = _read(proc_root / str(pid) / "stat").decode(errors="replace")
    fields = text[text.rfind(")") + 2:].split()  # the name (field 2) may hold spaces and parentheses
    try:
        return int(fields[19])
    except (IndexError, ValueError) as err:
        raise ProcReadError(f"reading {proc_root / str(pid) / 'stat'}: no start time") from err


def read_parent_pid(proc_root: Path, pid: int) -> int:
    """A process' parent (/proc/<pid>/stat, field 4): who started it, which a process cannot choose (its name it
    can: an MPS server is known by its parent, the agent's control daemon, never by its argv)."""
    text = _read(proc_root / str(pid) / "stat").decode(errors="replace")
    fields = text[text.rfind(")") + 2:].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError) as err:
        raise ProcReadError(f"reading {proc_root / str(pid) / 'stat'}: no parent") from err


def read_memory_limit(path: Path) -> int | None:
    """The agent container's cgroup memory limit in bytes (v2 `memory.max`); None if unlimited/unknown."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit():
        return None  # "max"
    value = int(text)
    return None if value >= 1 << 62 else value  # cgroup v1 "unlimited" is a huge number


def read_cgroup_controllers(path: Path) -> frozenset[str]:
    """The controllers the agent container's cgroup may use (v2 `cgroup.controllers`); none where it cannot be read
    (cgroup v1 has no such file)."""
    try:
        return frozenset(path.read_text().split())
    except OSError:
        return frozenset()


MPS_PROGRAMS = frozenset({"nvidia-cuda-mps-control", "nvidia-cuda-mps-server"})


def _programs(pid_dir: Path) -> set[str]:
    """Basenames naming a process: its `exe` (not `comm`, which is cut to 15 characters), and argv[0] and
    argv[1] (a script run by an interpreter)."""
    names = set()
    try:
        names.add(Path(os.readlink(pid_dir / "exe")).name)
    except OSError:
        pass
    try:
        argv = (pid_dir / "cmdline").read_bytes().split(b"\0")[:2]
    except OSError:
        return names
    names.update(Path(arg.decode(errors="replace")).name for arg in argv if arg)
    return names


def mps_processes(proc_root: Path, pipe_dir: Path, programs: frozenset[str] = MPS_PROGRAMS) -> list[int]:
    """PIDs of MPS control daemons and servers of this pipe directory (their environment names it): what a
    killed daemon or a killed agent left behind. Those of other pipe directories are not ours: left alone."""
    found: list[int] = []
    try:
        entries = list(proc_root.iterdir())
    except OSError:
        return found
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == os.getpid() or not _programs(entry) & programs:
            continue
        try:
            env = parse_environ((entry / "environ").read_bytes())
        except OSError:
            continue
        if env.get(LimitEnv.PIPE_DIRECTORY, "").rstrip("/") == str(pipe_dir).rstrip("/"):
            found.append(int(entry.name))
    return sorted(found)


def mps_control_processes(proc_root: Path, pipe_dir: Path) -> list[int]:
    """The control daemons (`-f`; not their servers, nor a short-lived client) of this pipe directory: one."""
    found = []
    for pid in mps_processes(proc_root, pipe_dir, frozenset({"nvidia-cuda-mps-control"})):
        try:
            argv = (proc_root / str(pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"-f" in argv:
            found.append(pid)
    return found


def container_cgroups(proc_root: Path, container_ids: Collection[str]) -> dict[str, str]:
    """For each of `container_ids` with a process on the node, one of its processes' /proc/<pid>/cgroup text: one
    scan of the proc root's PIDs, which ends once every container is found."""
    found: dict[str, str] = {}
    wanted = set(container_ids)
    try:
        entries = [e for e in os.scandir(proc_root) if e.name.isdigit()]
    except OSError:
        return found
    for entry in entries:
        if len(found) == len(wanted):
            break
        try:
            text = Path(entry.path, "cgroup").read_text(errors="replace")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        for cid in container_ids_in_cgroup(text) & wanted:
            found.setdefault(cid, text)
    return found
