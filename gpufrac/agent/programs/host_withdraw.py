"""What the agent leaves on its host, taken away when the release is uninstalled (not when one agent stops).

The chart's pre-delete hook deletes the agents' DaemonSet; each agent, stopping, asks whether its DaemonSet is
still there. Gone (or being deleted): the release is going away, and the agent removes the host paths the chart
named (`--withdraw-host-path`: the NRI lock directory, the MPS pipe directories, the DRA state and the claims' CDI
specs; shell globs allowed) through the host's root (host_root: the agent runs with hostPID), then the
`gpufrac` directories they leave empty. A rolling update or a drain finds the DaemonSet in place and removes
nothing: the next agent reads that state back.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)


class DaemonSetApi(Protocol):
    def daemonset_present(self, namespace: str, name: str) -> bool:
        """True while the DaemonSet exists and is not being deleted."""
        ...


def host_root(proc_root: Path, pid: int | None = None) -> Path:
    """The host's root as the agent (hostPID) reaches it: the root of its nearest ancestor in another mount namespace
    (the runtime's shim, in the host's), else `/proc/1/root`. Some hosts refuse /proc/1/root (a sandboxed init)."""
    try:
        own = os.readlink(proc_root / "self" / "ns" / "mnt")
        current = pid if pid is not None else os.getpid()
        while current > 1:
            current = _parent(proc_root, current)
            if current > 1 and os.readlink(proc_root / str(current) / "ns" / "mnt") != own:
                return proc_root / str(current) / "root"
    except (OSError, ValueError):
        pass
    return proc_root / "1" / "root"


def _parent(proc_root: Path, pid: int) -> int:
    for line in (proc_root / str(pid) / "status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return 0


def remove_host_paths(paths: Iterable[str], host_root: Path) -> list[str]:
    """Removes each path (a file, a tree, a glob) under `host_root`, then each `gpufrac` directory above one that
    it left empty; the host paths removed, in order."""
    removed: list[str] = []
    parents: set[Path] = set()
    for pattern in paths:
        relative = pattern.lstrip("/")
        for found in sorted(glob.glob(str(host_root / relative))):
            target = Path(found)
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
            removed.append("/" + str(target.relative_to(host_root)))
            parents.update(p for p in target.parents if p.name == "gpufrac" and p.is_relative_to(host_root))
    for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
        try:
            parent.rmdir()  # only when empty: another component's files stay
            removed.append("/" + str(parent.relative_to(host_root)))
        except OSError:
            pass
    return removed


def withdraw_from_host(kube: DaemonSetApi, namespace: str, daemonset: str, paths: Iterable[str],
                       host_root: Path) -> list[str] | None:
    """None while the agents' DaemonSet is in place (nothing removed); else the host paths removed."""
    try:
        if kube.daemonset_present(namespace, daemonset):
            return None
    except Exception as err:  # the API unreachable: leave the host as it is, a later uninstall finds it
        log.warning("cannot tell whether DaemonSet %s/%s is going away (%s): host paths kept", namespace, daemonset,
                    err)
        return None
    removed = remove_host_paths(paths, host_root)
    log.info("the release is uninstalled (DaemonSet %s/%s gone): removed %s from the host", namespace, daemonset,
             ", ".join(removed) or "nothing", extra={"removed": removed})
    return removed
