"""Rows 9a and 9b, escapes 2 and 3 of docs/security.md's matrix: the sm-sharing daemon's own pinned limit holds a
client whatever its env says, and a UUID-keyed env only lowers it.

gpufrac's agent tells the sm-sharing daemon each GPU's limit with the documented control commands
(`set_default_device_pinned_mem_limit <uuid> <n>M` for servers to come, `set_device_pinned_mem_limit <server pid>
<uuid> <n>M` for one running); these rows do the same and then start clients as a tenant's process could:

- 9a: one client with no pinned env at all (it dropped its env, escape 2), held to the daemon's limit A. A client
  whose env names a GPU it cannot see (escape 3) is NOT held by the daemon side: NVIDIA measured on 615.71.09 that it
  loses every pinned limit, the server's and the namespace's included; only the cgroup limit (rows 3) holds it;
- 9b: the daemon at 2A, one client keyed by its GPU's UUID asking A (held to A: a UUID key is applied on this
  driver), one asking 4A (held to 2A: the env cannot raise the daemon's value);
- 9c (MPS v3, r615+): the server at 2A (a larger neighbour's), a namespace made as the agent makes a container's, at
  A, and a client with no env whose pipe directory is that namespace's directory (what the NRI plugin mounts): held
  to A, its own limit, not the server's.

They run last but for row 10 (gpucheck/checks/dra.py) and rows 11c, 11d (gpucheck/checks/allocations.py), which
tell the daemon their own limits through `tell`: the daemon keeps the limits it is told until it stops.
"""

from __future__ import annotations

import os
import subprocess

from gpucheck.checks.daemons import Daemons
from gpucheck.checks.memory import MemoryLimits
from gpucheck.client_process import Client
from gpucheck.contract import (
    ENV_PINNED_MEM_LIMIT,
    ENV_PIPE_DIRECTORY,
    NAMESPACE_SERVER,
    SM_SHARING,
    daemon_limit_commands,
    namespace_commands,
    namespace_delete,
)
from gpucheck.rows import FAIL, PASS, Row
from gpucheck.session import Session

DROPPED = "9a", "daemon-side limit: env dropped"
UUID_KEYED = "9b", "daemon-side limit: a UUID-keyed env lowers it"
OWN_NAMESPACE = "9c", "daemon-side limit: a container's own MPS v3 namespace"
INVISIBLE = "9d", "daemon-side limit: an env naming a GPU the client cannot see drops it (NVIDIA's measurement)"
CONTROL = "9e", "a namespace's socket refuses control commands, from root and from another user"
NOBODY = 65534
NAMESPACE = "c00000000009c"  # the shape of the agent's names (decide.mps_namespaces)


class DaemonSideLimits:
    def __init__(self, session: Session, daemons: Daemons, memory: MemoryLimits) -> None:
        self.s = session
        self.daemons = daemons
        self.memory = memory

    def problem(self) -> str | None:
        """Why the daemon side cannot be checked here (None: it can)."""
        s = self.s
        return s.node.no_cuda() or self.daemons.problem(SM_SHARING) or (None if s.node.gpu_uuid else "no GPU UUID")

    def run(self) -> None:
        s = self.s
        reason = self.problem()
        if reason:
            s.skip((DROPPED, UUID_KEYED, OWN_NAMESPACE, INVISIBLE, CONTROL), reason)
            return
        a, _ = s.node.limits()
        s.guarded(DROPPED[0], lambda: self.dropped(a))
        s.guarded(UUID_KEYED[0], lambda: self.uuid_keyed(a))
        if not s.node.driver_limits:
            s.skip((OWN_NAMESPACE, INVISIBLE, CONTROL), "MPS v3 namespaces need driver r615+ with CUDA 13.4")
            return
        s.guarded(OWN_NAMESPACE[0], lambda: self.own_namespace(a))
        s.guarded(INVISIBLE[0], lambda: self.invisible(a))
        s.guarded(CONTROL[0], lambda: self.control_through_namespace(a))

    def tell(self, pinned_mib: int, thread_percent: int | None = None) -> list[dict[str, str]]:
        """The daemon's limits for this GPU (with a thread percentage, that too), as the agent tells them: the
        defaults for servers to come and each running server's."""
        uuid = self.s.node.gpu_uuid
        assert uuid is not None
        commands = daemon_limit_commands(uuid, pinned_mib, thread_percent, self.daemons.server_pids(SM_SHARING))
        return [self.command([], command + "\n", command) for command in commands]

    def command(self, words: list[str], stdin: str, said_as: str) -> dict[str, str]:
        """One command to the sm-sharing daemon (legacy syntax on stdin, MPS v3's as arguments); raises on a refusal."""
        assert self.s.node.mps_control is not None
        done = subprocess.run([self.s.node.mps_control, *words], input=stdin, capture_output=True, text=True,
                              timeout=self.s.bounded(20), check=False,
                              env={**self.s.base_env(), ENV_PIPE_DIRECTORY: self.daemons.pipe_dir(SM_SHARING)})
        answer = (done.stdout + done.stderr).strip()
        if done.returncode != 0 or answer.lower().startswith(("error", "unknown", "invalid")):
            raise RuntimeError(f"{said_as!r}: {answer or f'exit {done.returncode}'}")
        return {"command": said_as, "exit": str(done.returncode), "answer": answer[:200]}

    def client(self, name: str, limit: int, env: dict[str, str]) -> Client:
        return self.memory.probe_client(name, limit, self.daemons.pipe_dir(SM_SHARING), env)

    def dropped(self, a: int) -> None:
        said = self.tell(a)
        gpu = self.s.node.gpu_uuid
        clients = [self.client("daemon-no-env", a, {})]
        self.memory.row(DROPPED[0], DROPPED[1], clients, (a,), {"daemon": said, "env": [None], "visible": gpu})

    def uuid_keyed(self, a: int) -> None:
        said = self.tell(2 * a)
        gpu = self.s.node.gpu_uuid
        envs = [f"{gpu}={a}M", f"{gpu}={4 * a}M"]
        clients = [self.client("uuid-lower", a, {ENV_PINNED_MEM_LIMIT: envs[0]}),
                   self.client("uuid-higher", 2 * a, {ENV_PINNED_MEM_LIMIT: envs[1]})]
        self.memory.row(UUID_KEYED[0], UUID_KEYED[1], clients, (a, 2 * a),
                        {"daemon": said, "env": envs})

    def own_namespace(self, a: int) -> None:
        said = self.tell(2 * a)
        said += [self.command(words, "", " ".join(words)) for words in namespace_commands(NAMESPACE, a, 100)]
        try:
            own = os.path.join(self.daemons.pipe_dir(SM_SHARING), NAMESPACE_SERVER, NAMESPACE)
            client = self.memory.probe_client("own-namespace-no-env", a, own, {})
            self.memory.row(OWN_NAMESPACE[0], OWN_NAMESPACE[1], [client], (a,),
                            {"daemon": said, "pipe_directory": own, "server_limit_mib": 2 * a})
        finally:
            words = namespace_delete(NAMESPACE)
            self.command(words, "", " ".join(words))

    def invisible(self, a: int) -> None:
        """9d: the server at 2A, a namespace at A, two clients in it whose env names a GPU they cannot see (an index
        past their view, `0=AM,1=AM`; a UUID that is not present). NVIDIA measured on 615.71.09 that such a client
        loses every pinned limit, the server's and the namespace's: this row PASSES when the driver does that (each
        client allocates past 2A), which is what gpufrac's boundary labels assume (sm-sharing without the cgroup limit
        is `cooperative`), and FAILS, saying so, where this driver holds them."""
        said = self.tell(2 * a)
        said += [self.command(words, "", " ".join(words)) for words in namespace_commands(NAMESPACE, a, 100)]
        envs = [f"0={a}M,1={a}M", f"GPU-00000000-0000-0000-0000-00000000bad0={a}M"]
        own = os.path.join(self.daemons.pipe_dir(SM_SHARING), NAMESPACE_SERVER, NAMESPACE)
        try:
            clients = [self.memory.probe_client(f"invisible-{i}", 4 * a, own, {ENV_PINNED_MEM_LIMIT: env})
                       for i, env in enumerate(envs)]
            self.memory.dropped_row(INVISIBLE[0], INVISIBLE[1], clients, 2 * a,
                                    {"daemon": said, "env": envs, "pipe_directory": own})
        finally:
            words = namespace_delete(NAMESPACE)
            self.command(words, "", " ".join(words))

    def control_through_namespace(self, a: int) -> None:
        """9e: whether a namespace's socket accepts control commands is not documented (NVIDIA's MPS v3 pages). A
        client of the namespace (its directory as CUDA_MPS_PIPE_DIRECTORY, what a container has) sends `namespace set`
        and `server set` raising the limits to 8A, then `quit`, as root and (where the check runs as root) as another
        user. PASS when every one is refused and the daemon still runs; FAIL naming what was accepted."""
        said = [self.command(words, "", " ".join(words)) for words in namespace_commands(NAMESPACE, a, 100)]
        own = os.path.join(self.daemons.pipe_dir(SM_SHARING), NAMESPACE_SERVER, NAMESPACE)
        raise_to = f"--pinned-memory-limit={8 * a}M"
        tries = [["namespace", "set", NAMESPACE, f"--server={NAMESPACE_SERVER}", raise_to],
                 ["server", "set", f"--server={NAMESPACE_SERVER}", raise_to], ["quit"]]
        users = [None, NOBODY] if os.geteuid() == 0 else [None]
        answers = []
        try:
            for user in users:
                for words in tries:
                    answers.append(self.through(own, words, user))
        finally:
            words = namespace_delete(NAMESPACE)
            self.command(words, "", " ".join(words))
        accepted = [f"{t['command']!r} as {t['user']}" for t in answers if t["accepted"]]
        up = self.daemons.problem(SM_SHARING) is None
        self.s.add(Row(CONTROL[0], CONTROL[1], FAIL if accepted or not up else PASS,
                       f"accepted: {', '.join(accepted)}" if accepted else
                       ("every command refused" + ("" if up else ", but the daemon is no longer up")),
                       {"daemon": said, "tries": answers, "pipe_directory": own}))

    def through(self, pipe: str, words: list[str], user: int | None) -> dict[str, object]:
        assert self.s.node.mps_control is not None
        try:
            done = subprocess.run([self.s.node.mps_control, *words], input="", capture_output=True, text=True,
                                  timeout=self.s.bounded(20), check=False, user=user,
                                  env={**self.s.base_env(), ENV_PIPE_DIRECTORY: pipe})
            answer, code = (done.stdout + done.stderr).strip(), done.returncode
        except (OSError, subprocess.TimeoutExpired) as err:
            answer, code = str(err), -1
        refused = code != 0 or answer.lower().startswith(("error", "unknown", "invalid", "cannot"))
        return {"command": " ".join(words), "user": "root" if user is None else user, "exit": code,
                "answer": answer[:200], "accepted": not refused}
