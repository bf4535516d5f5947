"""A fake MPS client: what a process with this env gets from the fake daemon's server (its `fake_client` command).

The fake nvidia-cuda-mps-control decides it as NVIDIA documents and measured: the daemon side's value, lowered by the
client's env where that is well formed for the client's view of the GPUs, never raised.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.fakes.build import MPS_CONTROL


@dataclass(frozen=True)
class ClientLimits:
    pinned_mib: int | None  # None: no limit at all (the whole GPU)
    thread_percent: int


def connect(pipe_dir: Path, gpu: str, *, visible: tuple[str, ...] = (), env: dict[str, str] | None = None,
            binary: str = str(MPS_CONTROL)) -> ClientLimits:
    """A client on GPU `gpu` (a UUID) that sees `visible` (default: just it) and carries `env`."""
    env = env or {}
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


def records(log_dir: Path, event: str) -> list[dict[str, Any]]:
    """The fake daemon's record of one kind of event (`limit`, `client`, `command`, `start`)."""
    path = log_dir / "fake-mps-record.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [entry for entry in map(json.loads, lines) if entry.get("event") == event]
