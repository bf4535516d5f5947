"""The client's side of its conversation with the parent: JSON events out on stdout, words in on stdin."""

from __future__ import annotations

import json
import os
import select
import sys
import time
from typing import Any


def emit(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


_stdin_buffer = bytearray()


def wait_word(word: str, timeout: float) -> None:
    """Waits for a line `word` from the parent on stdin (read from the fd: no buffering hides a second word)."""
    deadline = time.monotonic() + timeout
    while True:
        while b"\n" in _stdin_buffer:
            line, _, rest = bytes(_stdin_buffer).partition(b"\n")
            _stdin_buffer[:] = rest
            if line.strip().decode(errors="replace") == word:
                return
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no {word!r} from the parent within {timeout:.0f}s")
        ready, _, _ = select.select([0], [], [], left)
        if ready:
            chunk = os.read(0, 4096)
            if not chunk:
                raise EOFError("the parent closed stdin")
            _stdin_buffer.extend(chunk)
