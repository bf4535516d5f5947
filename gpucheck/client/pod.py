"""A client's "pod": inside `unshare --mount --ipc --pid --fork --mount-proc`, its mount namespace made to look like
a pod's, and the facts the parent judges it by."""

from __future__ import annotations

import ctypes
import os
import subprocess
from typing import Any

from gpucheck.contract import ENV_PIPE_DIRECTORY
from gpucheck.files import is_socket

MS_NOSUID, MS_NODEV, MS_BIND = 2, 4, 4096


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    # int mount(const char *source, const char *target, const char *filesystemtype, unsigned long mountflags,
    #           const void *data) -- mount(2)
    if libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                  data.encode() if data else None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def enter_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """Inside `unshare --mount --ipc --pid --fork --mount-proc`: make this mount namespace look like a pod's. Hide
    the node's MPS directories (tmpfs over them), then bind back only what gpufrac delivers: the mode's pipe
    directory at the same path, and, when delivered, the daemon's /dev/shm (else a private tmpfs /dev/shm)."""
    kept = {d["source"]: os.open(d["source"], os.O_PATH | os.O_DIRECTORY) for d in pod["deliver"]}
    for path in pod["hide"]:
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
    for delivered in pod["deliver"]:
        os.makedirs(delivered["target"], exist_ok=True)
        _mount(f"/proc/self/fd/{kept[delivered['source']]}", delivered["target"], None, MS_BIND, None)
    if not pod["shm_delivered"]:
        _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for fd in kept.values():
        os.close(fd)
    pipe = pod["pipe_dir"]
    facts: dict[str, Any] = {
        "pid": os.getpid(),
        "ns": {ns: os.readlink(f"/proc/self/ns/{ns}") for ns in ("ipc", "mnt", "pid")},
        "control_socket": is_socket(os.path.join(pipe, "control")),
        "hidden": {path: not os.path.exists(path) for path in pod["expect_hidden"]},
        "shm_marker_visible": os.path.exists(pod["shm_marker"]),
    }
    try:
        probe = subprocess.run([pod["mps_control"]], input="get_server_list\n", capture_output=True, text=True,
                               timeout=15, env={**os.environ, ENV_PIPE_DIRECTORY: pipe}, check=False)
        facts["control_probe"] = {"rc": probe.returncode, "output": (probe.stdout + probe.stderr)[-300:]}
    except (OSError, subprocess.TimeoutExpired) as err:
        facts["control_probe"] = {"rc": None, "output": str(err)}
    return facts
