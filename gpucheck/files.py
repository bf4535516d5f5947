"""Small file reads and writes that never raise: the check goes on (and cleans up) whatever one of them meets."""

from __future__ import annotations

import os
import stat


def is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def tail(path: str, size: int = 400) -> str:
    try:
        with open(path, "rb") as f:
            return f.read()[-size:].decode(errors="replace").strip()
    except OSError:
        return ""


def write_quietly(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError:
        pass
