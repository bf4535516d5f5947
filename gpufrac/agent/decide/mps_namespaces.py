"""One MPS v3 namespace per sm-sharing container: its own limits on the daemon side, where no client can raise them.

A server's limits (mps_limits) are one per GPU, so containers with different limits on one GPU are held there to the
largest. MPS v3 (driver r615+) subdivides a server into namespaces, each with its own pinned memory limit and active
thread percentage, and routes a client to a namespace by the socket it connects to:
`$CUDA_MPS_PIPE_DIRECTORY/<server>/<namespace>/control` (NVIDIA's MPS v3 Namespaces). So the agent creates, on the
sm-sharing daemon's server `SERVER` (declared in its TOML config, mps_config), one namespace per sm-sharing container
with that container's limits, before the NRI plugin answers its creation; the plugin then mounts only that
namespace's directory at the container's pipe directory. Its processes see one socket, their namespace's: whatever
they do to their env, there is no other daemon, server or namespace to reach, and no control socket to send commands
to. The namespace goes when its container is no longer placed on the node.

Pure: names, paths and the command words of NVIDIA's `<module> <verb>` syntax (`nvidia-cuda-mps-control namespace
create ...`), written here once. A DRA claim's sm-sharing share gets one namespace for the claim, named from the
claim's namespace, name and request (which Prepare knows before any container exists): its CDI spec mounts that
namespace's directory, so every container of every pod that uses the claim is held to the claim's limits together.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from gpufrac.agent.decide.model import RunningContainer
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import NO_COMPUTE_CAP

SERVER = "gpufrac"  # the sm-sharing daemon's named server, whose namespaces hold each container
# Namespaces the agent made: `c` and 12 hex digits (any other name is left alone). Short, because a unix socket's
# path has at most 107 bytes and a namespace's is `<pipe dir>/<server>/<name>/control`.
NAME_PREFIX = "c"
_DIGITS = 12
_OURS = re.compile(rf"{NAME_PREFIX}[0-9a-f]{{{_DIGITS}}}")


@dataclass(frozen=True)
class Namespace:
    """One container's namespace on SERVER, and the limits it holds."""

    name: str
    pinned_mib: int
    thread_percent: int
    container: str  # `namespace/pod/container`, for the log and the condition

    @property
    def pipe_subdir(self) -> PurePosixPath:
        """Its directory under the daemon's pipe directory: what the container gets as its own."""
        return PurePosixPath(SERVER, self.name)

    def create(self) -> tuple[str, ...]:
        return ("namespace", "create", self.name, f"--server={SERVER}")

    def set_limits(self) -> tuple[str, ...]:
        return ("namespace", "set", self.name, f"--server={SERVER}", f"--pinned-memory-limit={self.pinned_mib}M",
                f"--active-thread-percentage={self.thread_percent}")


SOCKET_PATH_MAX = 107  # bytes of a unix socket's path (sun_path, less its terminating NUL)


def too_long(pipe_dir: str) -> str | None:
    """Why the daemon's namespaces' sockets would not fit under `pipe_dir` (None: they fit)."""
    socket = f"{pipe_dir}/{SERVER}/{NAME_PREFIX}{'0' * _DIGITS}/control"
    if len(socket.encode()) <= SOCKET_PATH_MAX:
        return None
    return (f"no MPS namespace per container: their sockets ({socket}) would be longer than a unix socket's "
            f"{SOCKET_PATH_MAX} bytes; a shorter mps.root gives each its own")


def namespace_name(pod_uid: str, container: str) -> str:
    """A container's namespace: the same for the same pod UID and container name (a restarted agent finds it)."""
    return NAME_PREFIX + hashlib.sha256(f"{pod_uid}/{container}".encode()).hexdigest()[:_DIGITS]


def claim_namespace_name(namespace: str, claim: str) -> str:
    """A DRA claim's share's namespace; `claim` is `<claim name>/<request>` (RunningContainer.claim)."""
    return namespace_name(f"claim:{namespace}", claim)


def is_ours(name: str) -> bool:
    return _OURS.fullmatch(name) is not None


def wanted(containers: Iterable[RunningContainer]) -> dict[str, Namespace]:
    """The namespaces the node's sm-sharing containers and claims' shares need, by name."""
    out = {}
    for c in containers:
        if c.mode is not ComputeMode.SM_SHARING or c.fraction.limit_mib is None:
            continue
        name = claim_namespace_name(c.namespace, c.claim) if c.claim else namespace_name(c.pod_uid, c.container)
        out[name] = Namespace(name, c.fraction.limit_mib, c.fraction.active_thread_percent or NO_COMPUTE_CAP,
                              f"{c.namespace}/{c.pod}/{c.container}")
    return out


def server_set(pinned_mib: int | None, thread_percent: int | None) -> tuple[str, ...] | None:
    """`server set` on SERVER: the limits its `default` namespace and any namespace without its own give (NVIDIA's
    MPS v3 Interface: without it they give the whole GPU). The largest of the node's sm-sharing fractions: every
    namespace of ours is held below it by its own; None: nothing to hold (no sm-sharing fraction)."""
    if pinned_mib is None:
        return None
    return ("server", "set", f"--server={SERVER}", f"--pinned-memory-limit={pinned_mib}M",
            f"--active-thread-percentage={thread_percent or NO_COMPUTE_CAP}")


def list_command() -> tuple[str, ...]:
    """NVIDIA's MPS v3 Interface: `list --format=csv,noheader` is the stable output (one namespace a line)."""
    return ("namespace", "list", f"--server={SERVER}", "--format=csv,noheader")


def delete_command(name: str, *, force: bool = False) -> tuple[str, ...]:
    """`namespace delete` fails while clients are attached unless `--force` (NVIDIA's MPS v3 Namespaces, r615)."""
    return ("namespace", "delete", name, f"--server={SERVER}", *(("--force",) if force else ()))


def listed(answer: str) -> set[str]:
    """The namespaces the agent made, from `namespace list`'s answer (one name first on each line)."""
    names = (line.replace(",", " ").split()[:1] for line in answer.splitlines())
    return {name[0] for name in names if name and is_ours(name[0])}


@dataclass(frozen=True)
class Changes:
    """What to tell the daemon to go from the namespaces it has to those wanted."""

    create: tuple[Namespace, ...]
    update: tuple[Namespace, ...]
    delete: tuple[str, ...]

    def commands(self) -> list[tuple[str, ...]]:
        return [delete_command(name) for name in self.delete] + self.making()

    def making(self) -> list[tuple[str, ...]]:
        """The commands that create and set: what a creation waits for (deletions wait for their clients)."""
        return ([words for ns in self.create for words in (ns.create(), ns.set_limits())]
                + [ns.set_limits() for ns in self.update])


def changes(has: Mapping[str, Namespace | None], want: Mapping[str, Namespace]) -> Changes:
    """`has`: the daemon's namespaces of ours, with the limits it was told (None: limits not known, set again)."""
    return Changes(tuple(ns for name, ns in sorted(want.items()) if name not in has),
                   tuple(ns for name, ns in sorted(want.items()) if name in has and has[name] != ns),
                   tuple(sorted(name for name in has if name not in want)))
