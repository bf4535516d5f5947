"""The one polling helper of the harness and the tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeoutError(RuntimeError):
    """`wait_until` ran out of time; the message names what it waited for."""


def wait_until(predicate: Callable[[], T], timeout: float = 30.0, what: str = "condition",
               interval: float = 0.05) -> T:
    """Poll until `predicate()` returns something truthy, and return it. The timeout only guards against a
    hang: nothing asserts on how long it took."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise WaitTimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
