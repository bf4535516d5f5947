"""The agent's hold on the GPUs' compute modes (decide.compute_modes): EXCLUSIVE_PROCESS where sm-sharing is served,
the mode found there given back when it no longer is. What could not be set is a problem for the node's condition."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Protocol

from gpufrac.agent.decide import compute_modes
from gpufrac.agent.decide.errors import NvmlError
from gpufrac.agent.decide.model import GpuInfo, RunningContainer

log = logging.getLogger(__name__)


class ComputeModeSource(Protocol):
    def compute_mode(self, uuid: str) -> int: ...

    def set_compute_mode(self, uuid: str, mode: int) -> None: ...


class ComputeModes:
    def __init__(self, nvml: ComputeModeSource) -> None:
        self.nvml = nvml
        self._lock = threading.Lock()
        self._found: dict[str, int] = {}  # GPU -> the mode it had before the agent made it exclusive
        self.problem: str | None = None

    def apply(self, containers: Iterable[RunningContainer], gpus: Sequence[GpuInfo]) -> str | None:
        """EXCLUSIVE_PROCESS on the GPUs serving the sm-sharing fractions among `containers`; the others the agent
        set get their mode back. Returns (and keeps, for the condition) what could not be done."""
        serving = compute_modes.sm_sharing_gpus(containers, gpus)
        problems = []
        with self._lock:
            todo = compute_modes.plan(serving, self._found)
            for uuid in todo.exclusive:
                problems.extend(self._make_exclusive(uuid))
            for uuid, mode in todo.restore:
                try:
                    self.nvml.set_compute_mode(uuid, mode)
                    del self._found[uuid]
                    log.info("GPU %s serves no sm-sharing fraction: compute mode %d given back", uuid, mode)
                except NvmlError as err:
                    problems.append(str(err))
        self.problem = "; ".join(problems) or None
        return self.problem

    def _make_exclusive(self, uuid: str) -> list[str]:
        try:
            mode = self.nvml.compute_mode(uuid)
            if mode != compute_modes.EXCLUSIVE_PROCESS:
                self.nvml.set_compute_mode(uuid, compute_modes.EXCLUSIVE_PROCESS)
                self._found.setdefault(uuid, mode)
                log.info("GPU %s serves sm-sharing: compute mode EXCLUSIVE_PROCESS (was %d)", uuid, mode)
        except NvmlError as err:
            return [f"GPU {uuid} serves sm-sharing but its compute mode is not EXCLUSIVE_PROCESS, so a process "
                    f"without its MPS pipe directory gets the whole GPU: {err}"]
        return []
