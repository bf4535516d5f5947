"""A container's GPU memory held to its limit across its processes: what to do beyond the Event. Pure.

Under MPS-only enforcement the pinned limit binds each client process, not the container: a container that starts
two CUDA processes can hold twice its limit. The audit sums a container's processes per GPU (a
`memory-over-limit` violation names each PID and the total); `overLimitAction` says what else happens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum


class OverLimitAction(StrEnum):
    EVENT = "event"  # the Warning Event and the metric only
    EVICT = "evict"  # evict the pod through the Eviction API (once per pod)
    KILL_NEWEST = "kill-newest"  # kill the container's newest GPU process; the others keep running


def newest(pids: Sequence[int], start_times: Mapping[int, int]) -> int | None:
    """The process started last (start time in clock ticks since boot; a later PID breaks a tie); None when no
    start time could be read (every process exited)."""
    known = [pid for pid in pids if pid in start_times]
    if not known:
        return None
    return max(known, key=lambda pid: (start_times[pid], pid))
