"""A fake MPS client: what a process with this env gets from the fake daemon's server (its `fake_client` command).

The fake nvidia-cuda-mps-control decides it as NVIDIA documents and measured: the daemon side's value, lowered by the
client's env where that is well formed for the client's view of the GPUs, never raised.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from testkit.fakes.build import MPS_CONTROL

EXCLUSIVE_PROCESS = 3  # NVML_COMPUTEMODE_EXCLUSIVE_PROCESS


@dataclass(frozen=True)
class ClientLimits:
    pinned_mib: int | None  # None: no limit at all (the whole GPU)
    thread_percent: int


def connect(pipe_dir: Path, gpu: str, *, visible: tuple[str, ...] = (), env: dict[str, str] | None = None,
            binary: str = str(MPS_CONTROL), cgroup: str | None = None) -> ClientLimits:
    """A client on GPU `gpu` (a UUID) that sees `visible` (default: just it) and carries `env`; in `cgroup` (a
    directory), the driver's hard limit there holds it too, whatever MPS gives (NVIDIA: the one limit a process
    cannot lift; read from the fake NVML, nvmlDeviceGetMemoryLimits_v1)."""
    got = _mps_client(pipe_dir, gpu, visible, env or {}, binary)
    held = cgroup_limit_mib(gpu, cgroup) if cgroup is not None else None
    if held is None:
        return got
    return ClientLimits(min(held, got.pinned_mib) if got.pinned_mib is not None else held, got.thread_percent)


def cgroup_limit_mib(gpu: str, cgroup: str) -> int | None:
    """The hard limit the fake NVML holds for `cgroup` on `gpu`, in MiB (None: none)."""
    pynvml.nvmlInit()
    try:
        got = _GetLimits(cgroup.encode(), 0, 0, 0)
        code = pynvml.nvmlLib.nvmlDeviceGetMemoryLimits_v1(pynvml.nvmlDeviceGetHandleByUUID(gpu), ctypes.byref(got))
    finally:
        pynvml.nvmlShutdown()
    return None if code != 0 or got.hardLimit == (1 << 64) - 1 else int(got.hardLimit) >> 20


class _GetLimits(ctypes.Structure):
    _fields_ = [("nameSpace", ctypes.c_char_p), ("softLimit", ctypes.c_ulonglong), ("hardLimit", ctypes.c_ulonglong),
                ("currentUsed", ctypes.c_ulonglong)]


def _mps_client(pipe_dir: Path, gpu: str, visible: tuple[str, ...], env: dict[str, str],
                binary: str) -> ClientLimits:
    words = ["fake_client", gpu, f"visible={','.join(visible or (gpu,))}"]
    if "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in env:
        words.append(f"pinned={env['CUDA_MPS_PINNED_DEVICE_MEM_LIMIT']}")
    if "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in env:
        words.append(f"threads={env['CUDA_MPS_ACTIVE_THREAD_PERCENTAGE']}")
    done = subprocess.run([binary], input=" ".join(words) + "\n", capture_output=True, text=True, check=True,
                          timeout=10, env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)})
    answer = dict(word.partition("=")[::2] for word in done.stdout.split())
    pinned = answer["pinned"]
    return ClientLimits(None if pinned == "none" else int(pinned), int(answer["threads"]))


def connect_without_pipe(gpu: str) -> ClientLimits | None:
    """A process on GPU `gpu` with no CUDA_MPS_PIPE_DIRECTORY (`env -i`, or unset): an ordinary CUDA process.
    NVIDIA (reference/nvidia-stack.md, MPS documentation): in the DEFAULT compute mode it gets the whole GPU, all SMs,
    no error; in EXCLUSIVE_PROCESS the MPS server holds the GPU's one context, so it gets no context at all (None).
    The compute mode is the fake NVML's (nvmlDeviceGetComputeMode, what nvmlDeviceSetComputeMode last set)."""
    pynvml.nvmlInit()
    try:
        mode = pynvml.nvmlDeviceGetComputeMode(pynvml.nvmlDeviceGetHandleByUUID(gpu))
    finally:
        pynvml.nvmlShutdown()
    return None if mode == EXCLUSIVE_PROCESS else ClientLimits(None, 100)


@contextmanager
def attached(namespace_dir: Path) -> Iterator[None]:
    """A client process attached to the MPS v3 namespace whose pipe directory is `namespace_dir`, while the block
    runs (the fake daemon counts it: `namespace delete` without --force and `namespace set` are then refused)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(namespace_dir / "control"))
        conn.sendall(b"fake_attach\n")
        conn.settimeout(10)
        assert conn.recv(64).startswith(b"attached"), "the fake daemon did not attach the client"
        yield


def records(log_dir: Path, event: str) -> list[dict[str, Any]]:
    """The fake daemon's record of one kind of event (`limit`, `client`, `command`, `start`)."""
    path = log_dir / "fake-mps-record.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [entry for entry in map(json.loads, lines) if entry.get("event") == event]
