"""What every demo does around its own steps (`make agent-demo`, `make demo`): say what starts, start the cluster,
stop it whatever happens, and end a failure with one line on stderr and exit status 1, never a traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Protocol, TypeVar


class Cluster(Protocol):
    timings: dict[str, float]

    def start(self) -> object: ...

    def stop(self, remove_workdir: bool = False) -> None: ...


C = TypeVar("C", bound=Cluster)


def say(msg: str) -> None:
    print(msg, flush=True)


def run_demo(cluster: C, starting: str, steps: Callable[[C], None], *, failures: tuple[type[Exception], ...],
             explain: Callable[[Exception], str] = str, remove_workdir: bool = False) -> int:
    """Start `cluster` (announced as `starting`), run `steps` on it, stop it: 0, or 1 when one of `failures` was
    raised (said with `explain`, which may add a log)."""
    say(f"== starting {starting} ...")
    try:
        cluster.start()
        say(f"   ready in {cluster.timings['cold_start_s']} s")
        steps(cluster)
        return 0
    except failures as exc:
        print(f"demo failed: {explain(exc)}", file=sys.stderr)
        return 1
    finally:
        say("== stopping the cluster")
        cluster.stop(remove_workdir=remove_workdir)
