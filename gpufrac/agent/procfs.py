"""Reading GPU processes' /proc entries (edge), and finding container IDs in cgroup paths (pure).

The proc root is configurable: the agent runs with hostPID and reads the host's /proc; tests lay out
`<root>/<pid>/cgroup` and `<root>/<pid>/environ`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpufrac.agent.errors import ProcReadError
from gpufrac.core.contract import LimitEnv

# A path component naming a container, across runtimes and cgroup drivers:
#   cgroup v1/cgroupfs: /kubepods/burstable/pod<uid>/<id>
#   systemd driver:     .../kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope
#                       (also crio-<id>.scope, docker-<id>.scope)
_CONTAINER_COMPONENT = re.compile(
    r"^(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})(?:\.scope)?$"
)
_RUNTIME_SCHEME = re.compile(r"^[a-z0-9.+-]+://")


def normalize_container_id(status_id: str) -> str:
    """`containerd://abc…` (as in pod status) → `abc…`."""
    return _RUNTIME_SCHEME.sub("", status_id.strip()).strip("/")


def container_ids_in_cgroup(text: str) -> set[str]:
    """Container IDs named by the paths of a /proc/<pid>/cgroup file (v1: many lines, v2: `0::/path`)."""
    ids: set[str] = set()
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for component in parts[2].split("/"):
            match = _CONTAINER_COMPONENT.match(component)
            if match:
                ids.add(match[1])
    return ids


def parse_environ(data: bytes) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in data.split(b"\0"):
        if not entry:
            continue
        name, sep, value = entry.partition(b"=")
        if sep:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise ProcReadError(f"reading {path}: {err.strerror or err}") from err


def read_cgroup(proc_root: Path, pid: int) -> str:
    return _read(proc_root / str(pid) / "cgroup").decode(errors="replace")


def read_environ(proc_root: Path, pid: int) -> dict[str, str]:
    return parse_environ(_read(proc_root / str(pid) / "environ"))


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
