"""Bind mounts for the CSI node plugin (edge): mount(2) and umount2(2) through libc, no mount binary needed."""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

from gpufrac.agent.decide.errors import AgentError

MS_RDONLY = 0x1
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MNT_DETACH = 0x2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


class MountError(AgentError):
    """A bind mount could not be made or undone."""


def _fail(what: str) -> MountError:
    code = ctypes.get_errno()
    return MountError(f"{what}: {os.strerror(code)} ({errno.errorcode.get(code, code)})")


def shows(target: Path, source: Path) -> bool:
    """Whether target is a view of source (a bind mount of it): the same directory inode on the same device."""
    try:
        a, b = os.stat(target), os.stat(source)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def bind(source: Path, target: Path, *, readonly: bool = False) -> None:
    """Bind-mount the directory source onto target (created when missing); read-only when asked."""
    target.mkdir(parents=True, exist_ok=True)
    if _libc.mount(bytes(source), bytes(target), None, MS_BIND, None) != 0:
        raise _fail(f"bind-mounting {source} on {target}")
    if readonly and _libc.mount(None, bytes(target), None, MS_BIND | MS_REMOUNT | MS_RDONLY, None) != 0:
        error = _fail(f"making the bind mount {target} read-only")
        _libc.umount2(bytes(target), MNT_DETACH)
        raise error


def _mount_points() -> set[str]:
    points = set()
    with open("/proc/self/mountinfo", encoding="utf-8") as mountinfo:
        for line in mountinfo:
            fields = line.split(" ")
            if len(fields) > 4:
                # octal escapes for space, tab, newline and backslash
                points.add(fields[4].encode().decode("unicode_escape"))
    return points


def is_mount_point(path: Path) -> bool:
    return os.path.abspath(path) in _mount_points()


def unmount(target: Path) -> bool:
    """Undo every mount stacked on target; False when none was there. A busy mount is detached."""
    undone = False
    while is_mount_point(target):
        if _libc.umount2(bytes(target), 0) != 0:
            if ctypes.get_errno() != errno.EBUSY or _libc.umount2(bytes(target), MNT_DETACH) != 0:
                raise _fail(f"unmounting {target}")
        undone = True
    return undone


def remove_dir(path: Path) -> None:
    """Remove an empty directory the plugin made; never what is inside a mount."""
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as err:
        raise MountError(f"removing {path}: {err.strerror or err}") from err
