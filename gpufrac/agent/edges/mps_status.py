"""The status file a `gpufrac mps` process keeps for its daemon, which the agent reads (edge).

`<log dir of the mode>/supervisor.json`: written atomically on every change, so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpufrac.agent.decide.model import DaemonState, DaemonStatus
from gpufrac.core.annotations import ComputeMode

STATUS_FILE = "supervisor.json"


def status_path(log_dir: Path) -> Path:
    return log_dir / STATUS_FILE


def write_status(log_dir: Path, status: DaemonStatus) -> None:
    body = {"mode": str(status.mode), "state": str(status.state), "up": status.up, "restarts": status.restarts,
            "failure": status.failure, "last_exit": status.last_exit, "pid": status.pid, "build": status.build}
    path = status_path(log_dir)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(body) + "\n")
    os.replace(tmp, path)


def read_status(log_dir: Path, mode: ComputeMode) -> DaemonStatus | None:
    """None when there is no readable status file (no `gpufrac mps` ran for this mode yet)."""
    try:
        body = json.loads(status_path(log_dir).read_text())
        return DaemonStatus(mode, DaemonState(body["state"]), bool(body["up"]), int(body["restarts"]),
                            body.get("failure"), body.get("last_exit"), body.get("pid"), body.get("build"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
