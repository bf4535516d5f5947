"""The one SIGTERM/SIGINT handler of `gpufrac agent` and `gpufrac mps`: a real signal sent to this process sets the
stop event their loops wait on, and says so in the log."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator

import pytest

from gpufrac.agent.programs.stop_signal import stop_on_signals


@pytest.fixture
def saved_handlers() -> Iterator[None]:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_sets_the_stop_event_and_is_logged(saved_handlers, caplog, sig):
    log = logging.getLogger("gpufrac.test-stop")
    stop = stop_on_signals(log, "the daemon gets `quit`")
    assert not stop.is_set()
    with caplog.at_level(logging.INFO, logger="gpufrac.test-stop"):
        os.kill(os.getpid(), sig)  # handled in the main thread, before kill returns to Python code
        assert stop.wait(5)
    assert f"{sig.name}: stopping (the daemon gets `quit`)" in caplog.text
