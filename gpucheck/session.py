"""What every check shares: the session (arguments, time budget, rows, client processes) and the node's facts."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gpucheck.client_process import Client, ClientError
from gpucheck.contract import ENV_PIPE_DIRECTORY, MIB
from gpucheck.nvml import Nvml, NvmlError
from gpucheck.processes import kill_group
from gpucheck.program import client_argv
from gpucheck.rows import FAIL, SKIPPED, Row


class InterruptedRun(Exception):  # noqa: N818 -- a signal, not an error
    pass


@dataclass
class Node:
    """What the inventory (check 1) found and the CUDA setup measured: what every other check runs on."""

    nvml: Nvml | None = None
    handle: ctypes.c_void_p | None = None
    gpu_uuid: str | None = None
    gpu_total_mib: int = 0
    compute_mode: str | None = None
    driver_limits: bool = False
    served: tuple[str, ...] = ()
    mps_control: str | None = None
    cuda_path: str | None = None
    cuda_reason: str = ""  # why there is no CUDA, in full (the inventory) and short (the other rows)
    cuda_short: str = ""
    device: dict[str, Any] = field(default_factory=dict)
    calibration: dict[str, Any] = field(default_factory=dict)
    unshare: str | None = None
    unshare_reason: str = ""

    def no_cuda(self) -> str | None:
        return None if self.cuda_path and self.device else f"no CUDA ({self.cuda_short})"

    def limits(self) -> tuple[int, int]:
        """Two different limits for two clients, fitting the GPU: (A, 2A), A up to 2 GiB."""
        a = max(256, min(2048, self.gpu_total_mib // 16)) if self.gpu_total_mib else 1024
        return a, 2 * a


class Session:
    """What every check shares: the arguments, the clock and its budget, the rows and raw numbers, the scratch
    directory, the node's facts, and the client processes (started, grouped, released, killed at the end)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.began = time.monotonic()
        self.deadline: float = self.began + float(args.budget)
        self.rows: list[Row] = []
        self.raw: dict[str, Any] = {}
        self.node = Node()
        self.clients: list[Client] = []
        self.root = args.workdir or tempfile.mkdtemp(prefix="gpufrac-gpu-check-")
        os.makedirs(self.root, exist_ok=True)
        self.clients_dir = os.path.join(self.root, "clients")
        os.makedirs(self.clients_dir, exist_ok=True)
        self.no_mps_dir = os.path.join(self.root, "no-mps")  # a pipe directory with no daemon: clients run alone
        os.makedirs(self.no_mps_dir, exist_ok=True)

    def log(self, message: str) -> None:
        say(f"[{time.monotonic() - self.began:6.1f}s] {message}\n")

    def add(self, row: Row) -> None:
        self.rows.append(row)
        self.log(f"{row.id} {row.name}: {row.status} {row.details}")

    def skip(self, rows: tuple[tuple[str, str], ...], reason: str) -> None:
        for row_id, name in rows:
            self.add(Row(row_id, name, SKIPPED, reason))

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def bounded(self, timeout: float) -> float:
        """A wait's timeout, cut to what is left of the budget (at least 5 s, so a last answer can still come)."""
        return min(timeout, max(self.left(), 5.0))

    def selected(self, check: str) -> bool:
        return not self.args.only or check in self.args.only

    def guarded(self, row_id: str, step: Any) -> None:
        """Runs one check: a bug, or an answer shaped as nobody expected, fails that check, not the whole run."""
        try:
            step()
        except (InterruptedRun, KeyboardInterrupt):
            raise
        except Exception as err:
            self.raw.setdefault("internal_errors", []).append(traceback.format_exc())
            self.add(Row(row_id, f"check {row_id}", FAIL, f"internal error: {type(err).__name__}: {err} "
                                                          "(traceback in the report's raw.internal_errors)"))

    # ---- client processes ----

    def base_env(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items()
                if not k.startswith(("CUDA_MPS_", "NVIDIA_GPU_MEMORY_")) and k != "CUDA_VISIBLE_DEVICES"}

    def client_env(self, pipe_dir: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = self.base_env()
        env[ENV_PIPE_DIRECTORY] = pipe_dir
        if self.node.gpu_uuid:
            env["CUDA_VISIBLE_DEVICES"] = self.node.gpu_uuid
        env.update(extra or {})
        return env

    def start_client(self, name: str, spec: dict[str, Any], env: dict[str, str], pod: bool = False) -> Client:
        spec = {"cuda": self.node.cuda_path, **spec}
        argv = [*client_argv(), "--client", json.dumps(spec)]
        if pod:
            assert self.node.unshare is not None
            argv = [self.node.unshare, "--mount", "--ipc", "--pid", "--fork", "--mount-proc", "--", *argv]
        stderr_path = os.path.join(self.clients_dir, f"{len(self.clients) + 1:02d}-{name}.stderr")
        client = Client(name, argv, env, stderr_path)
        self.clients.append(client)
        return client

    def group(self, clients: list[Client], ready_timeout: float = 120.0, result_timeout: float = 120.0,
              before_go: Any = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Waits until every client is ready, says go to all at once, waits for every result."""
        readies = [c.wait("ready", self.bounded(ready_timeout)) for c in clients]
        if before_go is not None:
            before_go()
        for client in clients:
            client.send("go")
        results = [c.wait("result", self.bounded(result_timeout)) for c in clients]
        return readies, results

    def finish(self, clients: list[Client]) -> None:
        for client in clients:
            client.send("release")
        for client in clients:
            client.close()

    @contextlib.contextmanager
    def row_of(self, row_id: str, name: str, clients: list[Client], numbers: dict[str, Any]) -> Iterator[None]:
        """A row's work with its clients: a client that fails (an error, an exit, a timeout) fails the row; the
        clients are released and closed whatever happens."""
        try:
            yield
        except ClientError as err:
            numbers["error"] = err.event
            self.add(Row(row_id, name, FAIL, str(err), numbers))
        finally:
            self.finish(clients)

    def kill_clients(self) -> None:
        for client in self.clients:
            if client.proc.poll() is None:
                kill_group(client.proc)
                client.proc.wait()

    def sample_processes(self) -> dict[str, Any]:
        """NVML's compute processes on the GPU now: pid -> MiB."""
        nvml, handle = self.node.nvml, self.node.handle
        if nvml is None or handle is None:
            return {}
        try:
            return {str(pid): (used // MIB if used is not None else None)
                    for pid, used in nvml.processes(handle).items()}
        except NvmlError as err:
            return {"error": str(err)}


def say(text: str) -> None:
    """Progress on stdout; a closed stdout (a pipe to `head`, a dropped ssh) must not stop the check or its cleanup."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError:
        pass
