"""What /proc's files and pod status say, parsed: container IDs in cgroup paths, a process's environment. Pure."""

from __future__ import annotations

import re

# A path component naming a container, across runtimes and cgroup drivers:
#   cgroup v1/cgroupfs: /kubepods/burstable/pod<uid>/<id>
#   systemd driver:     .../kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope
#                       (also crio-<id>.scope, docker-<id>.scope)
_CONTAINER_COMPONENT = re.compile(
    r"^(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})(?:\.scope)?$"
)
_RUNTIME_SCHEME = re.compile(r"^[a-z0-9.+-]+://")


def normalize_container_id(status_id: str) -> str:
    """`containerd://abc…` (as in pod status) → `abc…`."""
    return _RUNTIME_SCHEME.sub("", status_id.strip()).strip("/")


def container_ids_in_cgroup(text: str) -> set[str]:
    """Container IDs named by the paths of a /proc/<pid>/cgroup file (v1: many lines, v2: `0::/path`)."""
    ids: set[str] = set()
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for component in parts[2].split("/"):
            match = _CONTAINER_COMPONENT.match(component)
            if match:
                ids.add(match[1])
    return ids


def parse_environ(data: bytes) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in data.split(b"\0"):
        if not entry:
            continue
        name, sep, value = entry.partition(b"=")
        if sep:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env
