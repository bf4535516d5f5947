"""One MPS control daemon, started and stopped as gpufrac's agent does it."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from gpucheck.contract import DaemonLayout, daemon_argv, daemon_env, render_config
from gpucheck.files import is_socket, tail
from gpucheck.processes import kill_group, kill_mps_processes, wait_exit


@dataclass
class Daemon:
    """One MPS control daemon, run in the foreground (`-f`) as the agent runs it."""

    binary: str
    layout: DaemonLayout
    mps_v3: bool
    base_env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    started: dict[str, Any] = field(default_factory=dict)
    stopped: dict[str, Any] = field(default_factory=dict)

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and is_socket(self.layout.control_socket)

    def start(self, timeout: float = 20.0) -> dict[str, Any]:
        lay = self.layout
        for path in (lay.pipe_dir, lay.log_dir, os.path.dirname(lay.config_path)):
            os.makedirs(path, exist_ok=True)
        os.chmod(lay.pipe_dir, 0o755)  # clients of any UID must reach the socket (as the agent does)
        if self.mps_v3:
            with open(lay.config_path, "w") as config:
                config.write(render_config(lay.mode))
            os.chmod(lay.config_path, 0o644)
        argv = daemon_argv(self.binary, lay.mode, self.mps_v3, lay.config_path)
        began = time.monotonic()
        with open(os.path.join(lay.log_dir, "daemon-stdio.log"), "ab") as stdio:
            self.proc = subprocess.Popen(list(argv), env=daemon_env(self.base_env, lay), stdin=subprocess.PIPE,
                                         stdout=stdio, stderr=subprocess.STDOUT, start_new_session=True)
        while time.monotonic() - began < timeout and self.proc.poll() is None and not self.up:
            time.sleep(0.05)
        self.started = {"argv": list(argv), "pid": self.proc.pid, "up": self.up,
                        "seconds": round(time.monotonic() - began, 2), "exit": self.proc.poll()}
        if not self.up:
            self.started["log"] = tail(os.path.join(lay.log_dir, "control.log")) or tail(
                os.path.join(lay.log_dir, "daemon-stdio.log"))
        return self.started

    def stop(self, quit_timeout: float) -> dict[str, Any]:
        """`echo quit | nvidia-cuda-mps-control` with the daemon's env, then `quit` on its stdin, then SIGKILL to
        its process group and to any MPS server of its pipe directory left behind."""
        if self.proc is None or self.stopped:
            return self.stopped
        how = "already exited"
        began = time.monotonic()
        if self.proc.poll() is None:
            how = "quit"
            try:
                subprocess.run([self.binary], input=b"quit\n", env=daemon_env(self.base_env, self.layout),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                               timeout=max(quit_timeout, 15.0))  # the client returns once it has sent quit
            except (OSError, subprocess.TimeoutExpired):
                pass
            if not wait_exit(self.proc, quit_timeout):
                how = "quit on stdin"
                try:
                    assert self.proc.stdin is not None
                    self.proc.stdin.write(b"quit\n")
                    self.proc.stdin.flush()
                except (OSError, ValueError):
                    pass
                if not wait_exit(self.proc, min(5.0, quit_timeout)):
                    how = "killed (ignored quit)"
                    kill_group(self.proc)
                    self.proc.wait()
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        strays = kill_mps_processes(self.layout.pipe_dir)
        self.stopped = {"how": how, "exit": self.proc.returncode, "seconds": round(time.monotonic() - began, 2),
                        "strays_killed": strays}
        return self.stopped
