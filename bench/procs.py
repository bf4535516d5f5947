"""The bench's own reading of /proc: this process's resident memory (the harness's toolkit has the rest)."""

from __future__ import annotations

from e2e.toolkit.procs import rss_kib


def rss_mib(pid: int | str = "self") -> float:
    return rss_kib(pid) / 1024
