"""The whole run: the checks in their order, then the cleanup."""

from __future__ import annotations

import argparse
import time
from typing import Any

from gpucheck.checks.allocations import OtherAllocations
from gpucheck.checks.attribution import Attribution
from gpucheck.checks.compute import Compute
from gpucheck.checks.daemons import Daemons
from gpucheck.checks.dra import DraClaim
from gpucheck.checks.escapes import DaemonSideLimits
from gpucheck.checks.inventory import Inventory
from gpucheck.checks.memory import MemoryLimits
from gpucheck.checks.pods import Pods
from gpucheck.checks.runtime import Runtime
from gpucheck.contract import SM_SHARING, TIME_SLICING
from gpucheck.session import Session


def check_of(row_id: str) -> str:
    """The check a row belongs to, as --only names it: the row id's number ("9a" -> "9", "10" -> "10", "11c" -> "11")
    (rows 11a-11d run at two places in the order, both selected by --only 11)."""
    return row_id[:len(row_id) - len(row_id.lstrip("0123456789"))]


class Run:
    """The checks in their order (without MPS first, before any MPS server holds the GPU), then the cleanup."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.session = session = Session(args)
        self.inventory = Inventory(session)
        self.daemons = Daemons(session)
        self.memory = MemoryLimits(session, self.daemons)
        self.compute = Compute(session, self.daemons)
        self.pods = Pods(session, self.daemons)
        self.attribution = Attribution(session, self.daemons)
        self.runtime = Runtime(session)
        self.daemon_side = DaemonSideLimits(session, self.daemons, self.memory)
        self.dra = DraClaim(session, self.daemons, self.memory, self.daemon_side)
        self.allocations = OtherAllocations(session, self.daemons, self.memory, self.daemon_side)

    def steps(self) -> list[tuple[tuple[str, ...], Any]]:
        memory, compute = self.memory, self.compute
        return [
            (("4b",), lambda: compute.run("4b", None)),
            (("3a",), lambda: memory.driver("3a", None)),
            (("11a", "11b"), self.allocations.cgroup_rows),  # VMM and pools under 3a's limits, no MPS either
            (("2a",), lambda: memory.pinned("2a", SM_SHARING)),
            (("2b",), lambda: memory.pinned("2b", TIME_SLICING)),
            (("3b",), lambda: memory.driver("3b", TIME_SLICING)),
            (("3c",), lambda: memory.driver("3c", SM_SHARING)),
            (("4a",), lambda: compute.run("4a", SM_SHARING)),
            (("4c",), lambda: compute.run("4c", TIME_SLICING)),
            (("5a", "5b"), self.pods.run),
            (("6a", "6b", "6c"), self.attribution.run),
            (("8a", "8b", "8c"), self.runtime.run),
            # late (then 10, 11c, 11d): the daemon keeps these limits
            (("9a", "9b", "9c", "9d", "9e"), self.daemon_side.run),
            (("10",), self.dra.run),
            (("11c", "11d"), self.allocations.daemon_rows),  # the daemon told A again
        ]

    def run(self) -> None:
        s = self.session
        s.guarded("1", self.inventory.run)
        if s.node.nvml is None or s.node.handle is None:
            return
        s.guarded("1c", self.inventory.cuda_setup)
        self.daemons.start()
        if s.args.linger:
            s.log(f"daemons up; lingering {s.args.linger}s (--linger)")
            time.sleep(s.args.linger)
        for rows, step in self.steps():
            if not s.selected(check_of(rows[0])):
                continue
            if s.left() < 20:
                s.skip(tuple((row_id, f"check {row_id}") for row_id in rows), "the time budget (--budget) is used up")
                continue
            s.guarded(rows[0], step)

    def cleanup(self) -> None:
        self.session.kill_clients()
        self.runtime.cleanup()
        self.daemons.stop()
        self.memory.cgroups.remove()
        self.pods.remove_marker()
        if self.session.node.nvml is not None:
            self.session.node.nvml.shutdown()
