"""A cluster's recorded state, `<workdir>/state.json`: its kind, its processes (pid + start time, so a recycled pid
is never signalled), ports, tokens and owner. From it another process (``python -m e2e down``, the next test
session) stops exactly that cluster's processes and, for a real node, puts the machine back."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from e2e import machine
from e2e.names import DEFAULT_WORKDIR
from e2e.toolkit.procs import Proc, proc_start_time

STATE_FILE = "state.json"
REAL_NODE = "real-node"  # the kind whose state also records what it changed on the machine


def state_file(workdir: Path | str) -> Path:
    return Path(workdir) / STATE_FILE


def read(workdir: Path | str) -> dict[str, Any] | None:
    """The recorded state, or None without a readable one."""
    try:
        state = json.loads(state_file(workdir).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def write(workdir: Path, state: dict[str, Any]) -> None:
    """Atomically, readable by its owner only (it holds the users' tokens)."""
    path = state_file(workdir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def forget(workdir: Path | str) -> None:
    with contextlib.suppress(FileNotFoundError):
        state_file(workdir).unlink()


def stop_recorded(workdir: Path | str = DEFAULT_WORKDIR) -> list[str]:
    """Stop what `workdir/state.json` records (from any process), last started first; a real node's machine
    state goes too. Returns the names of the components that were still running."""
    state = read(workdir)
    if state is None:
        return []
    procs = state.get("procs", {})
    stopped = []
    for name in reversed(state.get("components") or list(procs)):
        rec = procs.get(name)
        if not rec:
            continue
        proc = Proc.from_json(name, rec)
        if proc.alive():
            proc.stop()
            stopped.append(name)
    if state.get("kind") == REAL_NODE:
        machine.clean_orphan(Path(workdir), state)
    forget(workdir)
    return stopped


def owner(workdir: Path | str) -> tuple[bool, bool] | None:
    """(detach, owner alive) from `workdir/state.json`, or None without one. A non-detached cluster whose
    owner is alive is in use (a test session, a demo) and stops itself."""
    state = read(workdir)
    if state is None:
        return None
    pid, start = state.get("owner_pid"), state.get("owner_start_time")
    alive = isinstance(pid, int) and start is not None and proc_start_time(pid) == start
    return bool(state.get("detach")), alive


def private_workdir(kind: str, root: Path = DEFAULT_WORKDIR) -> Path:
    """`<root>/<kind>-<pid>` for a cluster owned by this process (a test session, a demo), so that two of them
    running at once in the same checkout never share (or stop) each other's cluster. Directories of owners that
    are gone are cleaned up first, stopping anything they left running."""
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob(f"{kind}-*"):
        pid = old.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid() or proc_start_time(int(pid)) is not None:
            continue
        stop_recorded(old)
        shutil.rmtree(old, ignore_errors=True)
    return root / f"{kind}-{os.getpid()}"
