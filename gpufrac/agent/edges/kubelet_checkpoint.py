"""The kubelet's device manager checkpoint, read from the host: which whole GPUs it allocated to which container.

The agent mounts the kubelet's device-plugins directory read-only (not the file: the kubelet replaces the file by a
rename, which a file mount would not follow). The file is parsed again only when it changed. What can go wrong, and
what the NRI decision then knows:
- the directory is there but the file is not: no device plugin ever registered with this kubelet, so it allocated
  nothing (the kubelet writes the file when a plugin registers, and keeps it across restarts);
- the directory is absent (not mounted), the file unreadable or not a checkpoint: the allocations are unknown, said
  in one warning line per distinct problem (and once when it reads again), never a traceback.
"""

from __future__ import annotations

import logging
from pathlib import Path

from gpufrac.agent.decide.kubelet_allocations import (
    CHECKPOINT_NAME,
    NO_ALLOCATIONS,
    CheckpointError,
    KubeletAllocations,
    parse_checkpoint,
    unknown,
)

log = logging.getLogger(__name__)

DEFAULT_CHECKPOINT = Path("/var/lib/kubelet/device-plugins") / CHECKPOINT_NAME


class KubeletCheckpoint:
    def __init__(self, path: Path = DEFAULT_CHECKPOINT) -> None:
        self.path = path
        self._version: tuple[int, int, int] | None = None
        self._last = NO_ALLOCATIONS
        self._problem: str | None = None

    def allocations(self) -> KubeletAllocations:
        try:
            info = self.path.stat()
        except FileNotFoundError:
            return self._remember(None, self._missing())
        except OSError as err:
            return self._remember(None, unknown(f"the kubelet's device checkpoint {self.path}: {err.strerror}"))
        version = (info.st_ino, info.st_mtime_ns, info.st_size)
        if version != self._version or self._last.problem is not None:  # a problem: try again each time
            self._remember(version, self._read())
        return self._last

    def _missing(self) -> KubeletAllocations:
        if self.path.parent.is_dir():
            return NO_ALLOCATIONS
        return unknown(f"the kubelet's device-plugins directory {self.path.parent} is not there (mount it into the "
                       "agent read-only: the chart does; --nri-device-checkpoint names the file)")

    def _read(self) -> KubeletAllocations:
        try:
            return parse_checkpoint(self.path.read_bytes())
        except OSError as err:
            return unknown(f"the kubelet's device checkpoint {self.path} is not readable: {err.strerror}")
        except CheckpointError as err:
            return unknown(f"the kubelet's device checkpoint {self.path} does not parse: {err}")

    def _remember(self, version: tuple[int, int, int] | None, allocations: KubeletAllocations) -> KubeletAllocations:
        self._version = version
        self._last = allocations
        if allocations.problem != self._problem:
            if allocations.problem is not None:
                log.warning("%s; until it can be read, containers that are no fraction and name GPUs by ID are refused",
                            allocations.problem)
            else:
                log.info("the kubelet's device checkpoint %s reads again", self.path)
            self._problem = allocations.problem
        return allocations
