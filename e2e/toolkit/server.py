"""The one server-process wrapper: start a process, poll its readiness check, and fail with its log's tail when
it exits or never gets ready."""

from __future__ import annotations

import signal
import ssl
import time
import urllib.error
from collections.abc import Callable
from pathlib import Path

from e2e.toolkit.errors import ClusterError
from e2e.toolkit.procs import Proc, spawn

# What a readiness check may raise while the server is still coming up.
NOT_YET = (OSError, ssl.SSLError, urllib.error.URLError, ConnectionError)


def wait_ready(proc: Proc, ready: Callable[[], bool], timeout: float, interval: float = 0.1) -> None:
    """Poll `ready()` until it returns True; raise ClusterError with the log tail if the process exits or time
    runs out."""
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        if not proc.alive():
            raise ClusterError(f"{proc.name} exited during startup (rc {proc.returncode}); "
                               f"last lines of {proc.log}:\n{proc.tail()}")
        try:
            if ready():
                return
        except NOT_YET as exc:
            last = str(exc)
        if time.monotonic() > deadline:
            raise ClusterError(f"{proc.name} not ready after {timeout:.0f} s ({last}); "
                               f"last lines of {proc.log}:\n{proc.tail()}")
        time.sleep(interval)


def start_server(
    name: str,
    argv: list[str],
    log: Path,
    ready: Callable[[], bool],
    *,
    timeout: float = 60,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    die_with_parent_signal: int | None = signal.SIGKILL,
    own_session: bool = True,
) -> Proc:
    """Spawn `argv` (see procs.spawn) and wait until `ready()`; a server that does not get ready is stopped."""
    proc = spawn(name, argv, log, env=env, cwd=cwd, die_with_parent_signal=die_with_parent_signal,
                 own_session=own_session)
    try:
        wait_ready(proc, ready, timeout)
    except BaseException:
        proc.stop()
        raise
    return proc
