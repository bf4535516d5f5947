"""Finding and ending the processes the check leaves: a client's or daemon's process group, and the MPS processes
(control daemons, servers) of a pipe directory."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

from gpucheck.contract import ENV_PIPE_DIRECTORY


def kill_group(proc: subprocess.Popen[Any], sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_exit(proc: subprocess.Popen[Any], timeout: float) -> bool:
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def mps_processes(pipe_dir: str) -> list[int]:
    """PIDs of nvidia-cuda-mps-* processes (control daemons, servers) whose environment names pipe_dir."""
    wanted = f"{ENV_PIPE_DIRECTORY}={pipe_dir}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0")[0]
            if not os.path.basename(argv0).startswith(b"nvidia-cuda-mps"):
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if wanted in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def mps_server_pids(pipe_dirs: list[str]) -> list[int]:
    pids = []
    for pipe_dir in pipe_dirs:
        for pid in mps_processes(pipe_dir):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"mps-server" in f.read().split(b"\0")[0]:
                        pids.append(pid)
            except OSError:
                continue
    return pids


def kill_mps_processes(pipe_dir: str) -> list[int]:
    killed = []
    for pid in mps_processes(pipe_dir):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (ProcessLookupError, PermissionError):
            continue
    return killed
