"""Commands to a running MPS control daemon, through its own client (`nvidia-cuda-mps-control` without `-f`).

One process per command (the legacy syntax on its stdin, MPS v3's `<module> <verb>` as its arguments), with
`CUDA_MPS_PIPE_DIRECTORY` naming the daemon's pipe directory: the client writes the command to the daemon's control
socket and prints its answer. A daemon that is not there, a command it refuses
(`Unknown command`, an error line) or a client that hangs is a `MpsControlError` with the command and the answer.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from gpufrac.core.contract import LimitEnv

COMMAND_TIMEOUT = 10.0  # seconds: the control daemon answers at once, unless it is wedged


class MpsControlError(Exception):
    pass


def send(binary: str, pipe_dir: Path, command: str, *, timeout: float = COMMAND_TIMEOUT) -> str:
    """The daemon's answer to one command of the legacy interactive syntax (written to the client's stdin)."""
    return _run([binary], command + "\n", pipe_dir, command, timeout)


def invoke(binary: str, pipe_dir: Path, words: Sequence[str], *, deadline: float | None = None) -> str:
    """The daemon's answer to one command of MPS v3's `<module> <verb> ...` syntax (the client's arguments)."""
    command = " ".join(words)
    return _run([binary, *words], "", pipe_dir, command, _within(deadline, command, pipe_dir))


def _run(argv: list[str], stdin: str, pipe_dir: Path, command: str, timeout: float) -> str:
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, LimitEnv.PIPE_DIRECTORY: str(pipe_dir)}, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise MpsControlError(f"{command!r} to the MPS daemon in {pipe_dir}: {err}") from err
    answer = done.stdout.strip()
    if done.returncode != 0 or answer.lower().startswith(("unknown command", "error", "invalid")):
        raise MpsControlError(f"{command!r} to the MPS daemon in {pipe_dir}: "
                              f"{(answer or done.stderr.strip() or f'exit {done.returncode}')[:200]}")
    return answer


def _within(deadline: float | None, command: str, pipe_dir: Path) -> float:
    """A command's timeout: COMMAND_TIMEOUT, or what is left before `deadline` (time.monotonic)."""
    if deadline is None:
        return COMMAND_TIMEOUT
    left = deadline - time.monotonic()
    if left <= 0:
        raise MpsControlError(f"{command!r} to the MPS daemon in {pipe_dir}: no time left to send it")
    return min(left, COMMAND_TIMEOUT)


def send_all(binary: str, pipe_dir: Path, commands: Sequence[str], *, deadline: float | None = None) -> None:
    for command in commands:
        send(binary, pipe_dir, command, timeout=_within(deadline, command, pipe_dir))


def invoke_all(binary: str, pipe_dir: Path, commands: Sequence[Sequence[str]], *,
               deadline: float | None = None) -> None:
    for words in commands:
        invoke(binary, pipe_dir, words, deadline=deadline)


def server_pids(binary: str, pipe_dir: Path, *, deadline: float | None = None) -> list[int]:
    """The MPS servers the daemon runs (`get_server_list`: one PID a line)."""
    command = "get_server_list"
    return [int(line) for line in send(binary, pipe_dir, command, timeout=_within(deadline, command, pipe_dir)).split()
            if line.isdigit()]
