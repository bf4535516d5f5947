"""Child processes in their own session (pid == pgid), known by pid + start time, so that another process can
stop exactly them later (a recycled pid is never signalled); free loopback ports; CPU time of a group."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from e2e.toolkit.errors import ClusterError

TICKS = os.sysconf("SC_CLK_TCK")
_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now at `host`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def process_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/<pid>/stat after the command name) of every process still there."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        yield int(entry.name), stat[stat.rindex(")") + 2 :].split()


def proc_start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (field 22 of /proc/<pid>/stat); None if it is gone or a
    zombie. Together with the pid it identifies a process: a recycled pid has another start time."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def group_cpu_seconds(pgid: int) -> float:
    """User+system CPU seconds of the live processes in process group `pgid` (all their threads)."""
    return sum(int(f[11]) + int(f[12]) for _, f in process_stats() if int(f[2]) == pgid) / TICKS


def tail(path: Path | str, lines: int = 40) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def die_with_parent(sig: int):
    """A preexec_fn: the kernel sends `sig` to the child when the thread that started it dies (a SIGKILLed test
    run, say), so nothing outlives an owner that had no chance to clean up."""

    def preexec() -> None:  # runs in the child between fork and exec
        with contextlib.suppress(Exception):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))

    return preexec


@dataclass
class Proc:
    """A child process in its own session (pid == pgid), known by pid + start time."""

    name: str
    pid: int
    start_time: int
    log: str
    popen: subprocess.Popen | None = field(default=None, repr=False, compare=False)
    # False: the child shares our session and only it is signalled (a program that stops its own children).
    own_session: bool = True

    @classmethod
    def from_json(cls, name: str, rec: dict) -> Proc:
        return cls(name, rec["pid"], rec["start_time"], rec["log"])

    def alive(self) -> bool:
        if self.popen is not None and self.popen.poll() is not None:
            return False
        return proc_start_time(self.pid) == self.start_time

    def to_json(self) -> dict:
        return {"pid": self.pid, "start_time": self.start_time, "log": self.log}

    def tail(self, lines: int = 40) -> str:
        return tail(self.log, lines)

    def cpu_seconds(self) -> float:
        return group_cpu_seconds(self.pid)

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> None:
        """`sig` (SIGTERM) to the whole process group, SIGKILL after `timeout`, and reap it if it is our
        child. Members of the group that outlived the leader (gunicorn workers, say) go too."""
        if self.alive():
            self.signal(sig)
            if not self.wait_gone(timeout):
                self.signal(signal.SIGKILL)
                self.wait_gone(5.0)
        for pid in self._group_members() if self.own_session else ():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._reap()

    def kill(self) -> None:
        """SIGKILL the group at once: a crash, not a shutdown."""
        self.stop(timeout=0, sig=signal.SIGKILL)

    def _group_members(self) -> list[int]:
        """Live processes in our process group that started no earlier than the leader (so not a group that
        merely reuses the number)."""
        return [pid for pid, fields in process_stats()
                if fields[0] != "Z" and int(fields[2]) == self.pid and int(fields[19]) >= self.start_time]

    def signal(self, sig: int) -> None:
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.own_session:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)

    def wait_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if self.popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.popen.wait(timeout=0.05)
            if not self.alive():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def _reap(self) -> None:
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=1)


def spawn(
    name: str,
    argv: list[str],
    log: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    die_with_parent_signal: int | None = signal.SIGKILL,
    own_session: bool = True,
    pass_fds: tuple[int, ...] = (),
) -> Proc:
    """Start `argv` (in its own session unless told otherwise) with stdout and stderr appended to `log`;
    `pass_fds` stay open in the child."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"\n=== {time.strftime('%H:%M:%S')} starting {name}: {' '.join(argv)}\n".encode())
        out.flush()
        try:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=own_session,
                close_fds=True,
                pass_fds=pass_fds,
                preexec_fn=die_with_parent(die_with_parent_signal) if die_with_parent_signal else None,
            )
        except OSError as exc:
            raise ClusterError(f"cannot start {name} ({argv[0]}): {exc}") from exc
    start = None
    for _ in range(50):
        start = proc_start_time(popen.pid)
        if start is not None or popen.poll() is not None:
            break
        time.sleep(0.01)
    return Proc(name, popen.pid, start or -1, str(log), popen, own_session)


def rss_kib(*pids: int | str) -> int:
    """Resident memory of `pids` together (VmRSS), in KiB; a pid that is gone counts 0."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total
