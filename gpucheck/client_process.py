"""The parent's side of one client subprocess: started, its JSON events read by a thread, waited on, closed."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from typing import Any

from gpucheck.processes import kill_group


class ClientError(Exception):
    """A client exited, timed out or reported an error before the event the check waited for."""

    def __init__(self, name: str, text: str, event: dict[str, Any] | None = None) -> None:
        super().__init__(f"{name}: {text}")
        self.event = event or {}


class Client:
    """One client subprocess, its JSON events read by a thread."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], stderr_path: str) -> None:
        self.name = name
        self.stderr_path = stderr_path
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._eof = False
        with open(stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=stderr, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                event = json.loads(raw.decode(errors="replace"))
            except ValueError:
                continue
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def stderr_tail(self) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                return f.read()[-400:].decode(errors="replace").strip()
        except OSError:
            return ""

    def wait(self, kind: str, timeout: float) -> dict[str, Any]:
        """The first `kind` event; ClientError on an error event, exit or timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self.events:
                    if event.get("event") == kind:
                        return event
                    if event.get("event") == "error":
                        raise ClientError(self.name, f"{event.get('stage')}: {event.get('error')}", event)
                if self._eof:
                    raise ClientError(self.name, f"exited ({self.proc.poll()}) before {kind}: "
                                                  f"{self.stderr_tail() or 'no output'}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ClientError(self.name, f"no {kind} within {timeout:.0f}s")
                self._cond.wait(left)

    def send(self, word: str) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(word.encode() + b"\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass

    def close(self, timeout: float = 15.0) -> int | None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
            return self.proc.wait()
