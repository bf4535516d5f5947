"""The bench's own reading of /proc: resident memory of this process, PSS of a server's process group (the
harness's toolkit has the rest)."""

from __future__ import annotations

from pathlib import Path

from e2e.toolkit.procs import process_stats, rss_kib


def rss_mib(pid: int | str = "self") -> float:
    return rss_kib(pid) / 1024


def group_pids(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (a server's master and workers)."""
    return [pid for pid, f in process_stats() if f[0] != "Z" and int(f[2]) == pgid]


def pss_mib(pids: list[int]) -> float:
    """Proportional set size of these processes together, in MiB (shared pages split among their users): what
    they add to a cgroup's memory, near enough, without counting a page twice."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
        except OSError:
            continue
    return total / 1024
