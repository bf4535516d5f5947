"""The DRA driver's files on the node (edge): the per-claim CDI specs containerd reads, and the state file of the
prepared claims. Every write is a whole file renamed into place, so a reader (containerd, a restarted agent) never
sees half of one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from gpufrac.agent.dra.decide.prepare import spec_file_name

DEFAULT_CDI_DIR = Path("/var/run/cdi")  # transient specs: gone with a reboot, like the claims' containers
DEFAULT_STATE_FILE = Path("/var/lib/gpufrac/dra/prepared.json")


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ClaimSpecs:
    """One CDI spec file per claim in the CDI directory, named by the claim's UID."""

    def __init__(self, directory: Path = DEFAULT_CDI_DIR) -> None:
        self.directory = directory

    def path(self, claim_uid: str) -> Path:
        return self.directory / spec_file_name(claim_uid)

    def write(self, claim_uid: str, spec: dict[str, Any]) -> None:
        write_atomically(self.path(claim_uid), json.dumps(spec, indent=1, sort_keys=True) + "\n")

    def remove(self, claim_uid: str) -> None:
        self.path(claim_uid).unlink(missing_ok=True)

    def exists(self, claim_uid: str) -> bool:
        return self.path(claim_uid).is_file()


class StateFile:
    def __init__(self, path: Path = DEFAULT_STATE_FILE) -> None:
        self.path = path

    def read(self) -> str | None:
        """None when there is none yet (a first start)."""
        try:
            return self.path.read_text()
        except FileNotFoundError:
            return None

    def write(self, text: str) -> None:
        write_atomically(self.path, text)
