"""How a long-running agent program learns it must stop: SIGTERM (the pod deleted, the node drained) or SIGINT
(Ctrl-C by hand) sets one event, which the program's loop waits on so it can clean up (MPS daemons get `quit`)
rather than die in the middle of a step."""

from __future__ import annotations

import logging
import signal
import threading


def stop_on_signals(log: logging.Logger, cleanup: str) -> threading.Event:
    """An event set on SIGTERM or SIGINT, each logged with `cleanup`, what the program does before it exits.

    Call it from the main thread (Python installs signal handlers there only)."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("%s: stopping (%s)", signal.Signals(signum).name, cleanup)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop
