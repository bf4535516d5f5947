"""Supervises one `nvidia-cuda-mps-control -f` as a foreground child: restart with backoff, budget, quit.

The restart decision is the pure `next_restart`; `MpsSupervisor` is the edge that runs the process.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufrac.agent.decide.errors import MpsStartError
from gpufrac.agent.decide.model import DaemonState, DaemonStatus
from gpufrac.agent.decide.mps_config import DaemonSettings, MpsDaemonSpec
from gpufrac.agent.edges.procfs import mps_processes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestartPolicy:
    initial_backoff: float = 5.0
    max_backoff: float = 60.0
    max_restarts: int = 5  # crashes in a row before giving up; 0 = never give up
    stable_after: float = 300.0  # uptime after which the budget and backoff start over


@dataclass(frozen=True)
class RestartBudget:
    attempt: int  # restarts since the last stable run
    backoff: float  # the delay before the next restart


@dataclass(frozen=True)
class RestartDecision:
    restart: bool
    delay: float
    attempt: int


def initial_budget(policy: RestartPolicy) -> RestartBudget:
    return RestartBudget(0, policy.initial_backoff)


def next_restart(
    policy: RestartPolicy, budget: RestartBudget, uptime: float
) -> tuple[RestartDecision, RestartBudget]:
    """After the daemon exited unexpectedly having run `uptime` seconds: restart (when) or give up."""
    if uptime >= policy.stable_after:
        budget = initial_budget(policy)
    attempt = budget.attempt + 1
    if policy.max_restarts > 0 and attempt > policy.max_restarts:
        return RestartDecision(False, 0.0, budget.attempt), budget
    decision = RestartDecision(True, budget.backoff, attempt)
    return decision, RestartBudget(attempt, min(budget.backoff * 2, policy.max_backoff))


def remove_stale(pipe_dir: Path) -> list[Path]:
    """Remove a previous daemon's control socket and pipes (they make the next start fail). Returns them."""
    removed: list[Path] = []
    if not pipe_dir.is_dir():
        return removed
    for entry in pipe_dir.iterdir():
        try:
            mode = entry.lstat().st_mode
        except FileNotFoundError:
            continue
        if entry.name == "control" or stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode):
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.stat().st_mode)
    except OSError:
        return False


class MpsSupervisor:
    """Runs one daemon in a thread until `stop()`; `status()` is safe to call from any thread."""

    def __init__(
        self,
        spec: MpsDaemonSpec,
        policy: RestartPolicy,
        *,
        quit_timeout: float = DaemonSettings.quit_timeout,
        clock: Callable[[], float] = time.monotonic,
        proc_root: Path = Path("/proc"),
    ) -> None:
        self.spec = spec
        self.policy = policy
        self.quit_timeout = quit_timeout
        self._clock = clock
        self._proc_root = proc_root
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._state = DaemonState.STARTING
        self._failure: str | None = None
        self._last_exit: str | None = None
        self.restarts = 0
        self.restart_delays: list[float] = []  # the backoff before each restart, in order
        self.killed = False  # the last stop had to SIGKILL (the daemon ignored quit)

    # ---- lifecycle ----

    def prepare(self) -> None:
        """Directories and config; raises MpsStartError if the host paths are unusable."""
        try:
            self.spec.pipe_dir.mkdir(parents=True, exist_ok=True)
            self.spec.log_dir.mkdir(parents=True, exist_ok=True)
            os.chmod(self.spec.pipe_dir, 0o755)  # clients of any UID must reach the socket
            if self.spec.config_path is not None and self.spec.config_text is not None:
                self.spec.config_path.parent.mkdir(parents=True, exist_ok=True)
                self.spec.config_path.write_text(self.spec.config_text)
                os.chmod(self.spec.config_path, 0o644)
        except OSError as err:
            raise MpsStartError(f"preparing the {self.spec.mode} MPS daemon's directories: {err}") from err

    def start(self) -> None:
        self.prepare()
        self._thread = threading.Thread(target=self._run, name=f"mps-{self.spec.mode}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Graceful stop: `quit` on stdin, wait up to quit_timeout, then SIGKILL its process group."""
        self._stopping.set()
        with self._lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            self._quit_or_kill(proc)
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self._state is not DaemonState.FAILED:
                self._state = DaemonState.STOPPED

    def _quit_or_kill(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            assert proc.stdin is not None
            proc.stdin.write(b"quit\n")
            proc.stdin.flush()
        except (OSError, ValueError):
            pass  # already gone, or its stdin is closed
        try:
            proc.wait(self.quit_timeout)
            return
        except subprocess.TimeoutExpired:
            log.warning("%s MPS daemon ignored quit for %.0fs, killing it", self.spec.mode, self.quit_timeout)
        self.killed = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the control daemon and the servers it started
        except ProcessLookupError:
            pass
        proc.wait()
        self.kill_strays()

    def kill_strays(self) -> list[int]:
        """SIGKILL MPS processes of this pipe directory that outlived their supervisor: servers of a crashed or
        killed daemon (they hold GPU contexts nobody manages), or a daemon a killed agent left running (a new one
        beside it would fight over the pipe directory)."""
        killed = []
        for pid in mps_processes(self._proc_root, self.spec.pipe_dir):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except (ProcessLookupError, PermissionError):
                continue
        if killed:
            log.warning("killed stray %s MPS processes: %s", self.spec.mode, killed)
        return killed

    # ---- the supervision loop ----

    def _spawn(self) -> subprocess.Popen[bytes]:
        stdio = open(self.spec.log_dir / "daemon-stdio.log", "ab")
        try:
            return subprocess.Popen(
                list(self.spec.argv),
                env=self.spec.env,
                stdin=subprocess.PIPE,
                stdout=stdio,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            stdio.close()

    def _run(self) -> None:
        budget = initial_budget(self.policy)
        while not self._stopping.is_set():
            self.kill_strays()
            removed = remove_stale(self.spec.pipe_dir)
            if removed:
                log.info("removed stale MPS files: %s", ", ".join(map(str, removed)))
            started = self._clock()
            try:
                proc = self._spawn()
            except OSError as err:
                log.error("cannot start the %s MPS daemon: %s", self.spec.mode, err)
                exit_text = f"could not be started ({err})"
            else:
                with self._lock:
                    self._proc = proc
                    self._state = DaemonState.RUNNING
                if self._stopping.is_set() and proc.poll() is None:
                    self._quit_or_kill(proc)  # stop() raced with the spawn
                code = proc.wait()
                if proc.stdin is not None:
                    proc.stdin.close()
                exit_text = f"exited with code {code}"
            if self._stopping.is_set():
                break
            decision, budget = next_restart(self.policy, budget, self._clock() - started)
            if not decision.restart:
                with self._lock:
                    self._state = DaemonState.FAILED
                    self._failure = (
                        f"{exit_text} and was restarted {self.policy.max_restarts} times in a row "
                        "without staying up; giving up"
                    )
                log.error("%s MPS daemon %s", self.spec.mode, self._failure)
                return
            log.warning(
                "%s MPS daemon %s, restart %d in %.1fs",
                self.spec.mode,
                exit_text,
                decision.attempt,
                decision.delay,
            )
            with self._lock:
                self._state = DaemonState.BACKOFF
                self._last_exit = exit_text
                self.restarts += 1
                self.restart_delays.append(decision.delay)
            self._stopping.wait(decision.delay)

    # ---- health ----

    def status(self) -> DaemonStatus:
        with self._lock:
            proc, state, failure, restarts = self._proc, self._state, self._failure, self.restarts
            last_exit = self._last_exit
        alive = proc is not None and proc.poll() is None
        up = state is DaemonState.RUNNING and alive and is_socket(self.spec.control_socket)
        pid = proc.pid if proc is not None and alive else None
        return DaemonStatus(self.spec.mode, state, up, restarts, failure, last_exit, pid)

    @property
    def pid(self) -> int | None:
        with self._lock:
            return self._proc.pid if self._proc is not None else None
