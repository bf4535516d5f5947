"""Rows 2 and 3, memory limits: MPS's pinned limit, and CUDA 13.4's, applied to a cgroup as the toolkit's hook does."""

from __future__ import annotations

import os
from typing import Any

from gpucheck.checks.cgroups import Cgroups
from gpucheck.checks.daemons import Daemons
from gpucheck.client.allocations import PLAIN
from gpucheck.client_process import Client
from gpucheck.contract import (
    ENV_MEMORY_LIMIT,
    ENV_MEMORY_REQUEST,
    ENV_PINNED_MEM_LIMIT,
    MIB,
    format_pinned_mem_limit,
    memory_env_value,
)
from gpucheck.judge import judge_probe, probe_max_mib, worst
from gpucheck.nvml import NvmlError
from gpucheck.pairs import zip3, zip_pairs
from gpucheck.rows import FAIL, PASS, SKIPPED, Row
from gpucheck.session import Session


class MemoryLimits:
    def __init__(self, session: Session, daemons: Daemons) -> None:
        self.s = session
        self.daemons = daemons
        self.cgroups = Cgroups(session)

    def pinned(self, row_id: str, mode: str) -> None:
        """2a, 2b: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, as the webhook writes it, holds each of two clients."""
        s = self.s
        name = f"pinned limit, {mode} daemon"
        reason = s.node.no_cuda() or self.daemons.problem(mode)
        if reason:
            s.add(Row(row_id, name, SKIPPED, reason))
            return
        a, b = s.node.limits()
        pipe = self.daemons.pipe_dir(mode)
        clients = [self.probe_client(f"pinned-{mode}-{label}", limit, pipe,
                                     {ENV_PINNED_MEM_LIMIT: format_pinned_mem_limit(limit, 1)})
                   for label, limit in (("a", a), ("b", b))]
        self.row(row_id, name, clients, (a, b), {"env": {ENV_PINNED_MEM_LIMIT: [
            format_pinned_mem_limit(a, 1), format_pinned_mem_limit(b, 1)]}})

    def driver(self, row_id: str, mode: str | None, kind: str = PLAIN, name: str = "") -> None:
        """3a-3c: NVIDIA_GPU_MEMORY_REQUEST/LIMIT applied to each client's own cgroup through NVML hold it (11a, 11b:
        clients allocating the `kind` way, gpucheck/checks/allocations.py)."""
        s = self.s
        name = name or f"13.4 limits, {'no MPS' if mode is None else f'{mode} daemon'}"
        reason = self.cgroups.problem() or s.node.no_cuda() or (self.daemons.problem(mode) if mode else None)
        if reason:
            s.add(Row(row_id, name, SKIPPED, reason))
            return
        nvml, handle = s.node.nvml, s.node.handle
        assert nvml is not None and handle is not None
        pipe = self.daemons.pipe_dir(mode)
        a, b = s.node.limits()
        clients: list[Client] = []
        numbers: dict[str, Any] = {"cgroups": []}
        try:
            for label, limit in (("a", a), ("b", b)):
                env = {ENV_MEMORY_REQUEST: memory_env_value(limit // 2), ENV_MEMORY_LIMIT: memory_env_value(limit)}
                leaf = self.cgroups.leaf(f"{row_id}-{label}")
                # as the toolkit's apply-cuda-memory-limits hook: the env's MiB, in bytes, on the cgroup
                nvml.set_memory_limits(handle, leaf, int(env[ENV_MEMORY_REQUEST]) * MIB,
                                       int(env[ENV_MEMORY_LIMIT]) * MIB)
                numbers["cgroups"].append({"path": leaf, "env": env, "backend": "dmem" if os.path.exists(
                    os.path.join(leaf, "dmem.max")) else "misc", "read_back": nvml.get_memory_limits(handle, leaf)})
                clients.append(self.probe_client(f"limits-{row_id}-{label}", limit, pipe, env,
                                                 {"cgroup": leaf, "probe_kind": kind}))
        except (OSError, NvmlError) as err:
            for client in clients:
                client.close()
            s.add(Row(row_id, name, FAIL, f"setting the limits failed: {err}", numbers))
            return
        self.row(row_id, name, clients, (a, b), numbers)

    def probe_client(self, name: str, limit: int, pipe: str, env: dict[str, str], spec: dict[str, Any] | None = None
                     ) -> Client:
        """A client that, on go, allocates until it is refused (or well past `limit`) and holds what it got until
        released: what `row` judges. `env` is its limit env, on top of the pipe directory and its one GPU."""
        return self.s.start_client(name, {"probe_max_mib": probe_max_mib(limit), "hold": True, **(spec or {})},
                                   self.s.client_env(pipe, env))

    def dropped_row(self, row_id: str, name: str, clients: list[Client], held_mib: int,
                    numbers: dict[str, Any]) -> None:
        """Clients whose pinned limits MPS is expected to drop: each must allocate past `held_mib`, the largest
        limit that would otherwise hold it (NVIDIA's measurement); one held at or below it fails the row."""
        s = self.s
        with s.row_of(row_id, name, clients, numbers):
            _, results = s.group(clients)
            got = [r["probe"].get("allocated_mib", 0) for r in results]
            numbers["allocated_mib"] = got
            held = [mib for mib in got if mib <= held_mib]
            s.add(Row(row_id, name, FAIL if held else PASS,
                      (f"held at {held} MiB (limit {held_mib} MiB): this driver does not drop the pinned limits "
                       "as NVIDIA measured on 615.71.09") if held else
                      f"every pinned limit dropped: allocated {got} MiB past {held_mib} MiB, as NVIDIA measured",
                      numbers))

    def row(self, row_id: str, name: str, clients: list[Client], limits: tuple[int, ...],
            numbers: dict[str, Any], lead: str = "") -> None:
        """Clients probing at once (two, or one), each to its own limit; all hold their memory until all are done.
        `lead` begins the row's details (what the clients were given)."""
        s = self.s
        with s.row_of(row_id, name, clients, numbers):
            readies, results = s.group(clients)
            numbers["nvml_processes"] = s.sample_processes()
            verdicts = [judge_probe(limit, r["probe"]) for limit, r in zip_pairs(limits, results)]
            numbers["clients"] = [{"limit_mib": limit, "probe": {k: v for k, v in r["probe"].items() if k != "chunks"},
                                   "mem_before": ready.get("mem"), "mem_after": r.get("mem_after"), "pid": ready["pid"]}
                                  for limit, ready, r in zip3(limits, readies, results)]
            status = worst([v[0] for v in verdicts])
            texts = [f"{f'client {chr(97 + i)}: ' if len(clients) > 1 else ''}{text} "
                     f"(cuMemGetInfo total {r.get('mem_after', {}).get('total_mib')} MiB)"
                     for i, ((_, text), r) in enumerate(zip_pairs(verdicts, results))]
            s.add(Row(row_id, name, status, lead + "; ".join(texts), numbers))
