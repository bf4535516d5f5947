"""Host sysctls the kubelet changes (it sets its kernel defaults): recorded before the node starts, written
back when it goes."""

from __future__ import annotations

import contextlib
from pathlib import Path

# Global (not per network namespace) keys the kubelet writes; ip_forward is set inside the node's own
# network namespace and never on the host.
KUBELET_SYSCTLS = ("kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory", "kernel/keys/root_maxkeys",
                   "kernel/keys/root_maxbytes")


def record(keys: tuple[str, ...] = KUBELET_SYSCTLS) -> dict[str, str]:
    values = {}
    for key in keys:
        with contextlib.suppress(OSError):
            values[key] = Path("/proc/sys", key).read_text().strip()
    return values


def restore(values: dict[str, str]) -> dict[str, str]:
    """Write `values` back; returns the keys that had changed (key -> the value found)."""
    changed = {}
    for key, value in values.items():
        path = Path("/proc/sys", key)
        with contextlib.suppress(OSError):
            now = path.read_text().strip()
            if now != value:
                path.write_text(value)
                changed[key] = now
    return changed
