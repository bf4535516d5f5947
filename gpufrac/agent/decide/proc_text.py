"""What /proc's files and pod status say, parsed: container IDs in cgroup paths, a process's environment. Pure."""

from __future__ import annotations

import re
from collections.abc import Iterator

# A path component naming a container, across runtimes and cgroup drivers:
#   cgroup v1/cgroupfs: /kubepods/burstable/pod<uid>/<id>
#   systemd driver:     .../kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope
#                       (also crio-<id>.scope, docker-<id>.scope)
_CONTAINER_COMPONENT = re.compile(
    r"^(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})(?:\.scope)?$"
)
_RUNTIME_SCHEME = re.compile(r"^[a-z0-9.+-]+://+")
# A path component naming a pod: `pod<uid>` (cgroupfs), `kubepods-burstable-pod<uid, - as _>.slice` (systemd)
_POD_COMPONENT = re.compile(
    r"^(?:kubepods(?:-[a-z]+)?-)?pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
    r"(?:\.slice)?$"
)


def normalize_container_id(status_id: str) -> str:
    """`containerd://abc…` (as in pod status) → `abc…`."""
    return _RUNTIME_SCHEME.sub("", status_id.strip())


def _path_components(text: str) -> Iterator[str]:
    """The path components of a /proc/<pid>/cgroup file's lines (v1: many lines, v2: `0::/path`)."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            yield from parts[2].split("/")


def container_ids_in_cgroup(text: str) -> set[str]:
    """Container IDs named by the paths of a /proc/<pid>/cgroup file."""
    return {match[1] for component in _path_components(text) if (match := _CONTAINER_COMPONENT.match(component))}


def pod_uids_in_cgroup(text: str) -> set[str]:
    """Pod UIDs named by the paths of a /proc/<pid>/cgroup file (the kubelet's pod cgroups), as in the pod's
    metadata (dashes)."""
    return {match[1].replace("_", "-") for component in _path_components(text)
            if (match := _POD_COMPONENT.match(component))}


def parse_environ(data: bytes) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in data.split(b"\0"):
        if not entry:
            continue
        name, sep, value = entry.partition(b"=")
        if sep:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env
