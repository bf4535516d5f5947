"""Row 6, attribution: NVML's per-process memory and SM utilization name the clients, not only the MPS server."""

from __future__ import annotations

import time
from typing import Any

from gpucheck.checks.daemons import Daemons
from gpucheck.client_process import ClientError
from gpucheck.contract import ENV_PINNED_MEM_LIMIT, MIB, SM_SHARING, format_pinned_mem_limit
from gpucheck.nvml import NvmlError
from gpucheck.rows import FAIL, PASS, SKIPPED, Row
from gpucheck.session import Session


class Attribution:
    MEMORY = "6a", "attribution: memory"
    UTILIZATION = "6b", "attribution: utilization"
    CHARGED = "6c", "attribution: MPS memory charged to"

    def __init__(self, session: Session, daemons: Daemons) -> None:
        self.s = session
        self.daemons = daemons

    def run(self) -> None:
        """While two sm-sharing clients hold memory and spin, NVML names each client, not only the MPS server."""
        s = self.s
        reason = s.node.no_cuda() or self.daemons.problem(SM_SHARING)
        if reason:
            s.skip((self.MEMORY, self.UTILIZATION, self.CHARGED), reason)
            return
        a, _ = s.node.limits()
        alloc = a // 2
        spin_s = max(s.args.spin_seconds, 4.0)
        iterations = int(s.node.calibration["iterations"] * spin_s / s.args.spin_seconds)
        blocks = 2 * int(s.node.device.get("sm_count", 1))
        clients = [s.start_client(f"attribution-{x}", {"alloc_mib": alloc, "spin_iterations": iterations,
                                                       "blocks": blocks, "threads": 128},
                                  s.client_env(self.daemons.pipe_dir(SM_SHARING),
                                               {ENV_PINNED_MEM_LIMIT: format_pinned_mem_limit(a, 1)}))
                   for x in "ab"]
        numbers: dict[str, Any] = {"alloc_mib": alloc, "blocks": blocks}
        try:
            for client in clients:
                client.wait("ready", s.bounded(120))
            since = int(time.time() * 1e6)
            for client in clients:
                client.send("go")
            for client in clients:
                client.wait("allocated", s.bounded(60))
            pids = [c.proc.pid for c in clients]
            memory, util = self.sample(since, spin_s * 0.8, numbers)
            for client in clients:
                client.wait("result", s.bounded(spin_s * 4 + 60))
            servers = self.daemons.server_pids()
            numbers.update(client_pids=pids, mps_server_pids=servers,
                           memory_mib={str(p): (u // MIB if u else u) for p, u in memory.items()},
                           sm_util={str(p): u for p, u in util.items()})
            s.add(attribution_memory_row(*self.MEMORY, pids, servers, memory, alloc, numbers))
            s.add(attribution_util_row(*self.UTILIZATION, pids, servers, util, numbers))
            s.add(charged_to_row(*self.CHARGED, pids, servers, memory, alloc, numbers))
        except (ClientError, NvmlError) as err:
            numbers["error"] = getattr(err, "event", str(err))
            for row_id, name in (self.MEMORY, self.UTILIZATION, self.CHARGED):
                s.add(Row(row_id, name, FAIL, str(err), numbers))
        finally:
            s.finish(clients)

    def sample(self, since_us: int, seconds: float,
               numbers: dict[str, Any]) -> tuple[dict[int, int | None], dict[int, int]]:
        """Each PID's most memory and SM utilization NVML reports over `seconds`."""
        nvml, handle = self.s.node.nvml, self.s.node.handle
        assert nvml is not None and handle is not None
        memory: dict[int, int | None] = {}
        util: dict[int, int] = {}
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.5)
            for pid, used in nvml.processes(handle).items():
                memory[pid] = max(memory.get(pid) or 0, used or 0) if used is not None else memory.get(pid)
            try:
                samples = nvml.utilization(handle, since_us)
            except NvmlError as err:
                numbers["utilization_error"] = str(err)
                samples = []
            for pid, _, sm in samples:
                util[pid] = max(util.get(pid, 0), sm)
        return memory, util


def attribution_memory_row(row_id: str, name: str, pids: list[int], servers: list[int],
                           memory: dict[int, int | None], alloc_mib: int, numbers: dict[str, Any]) -> Row:
    missing = [p for p in pids if p not in memory]
    short = [p for p in pids if p in memory and (memory[p] or 0) < alloc_mib * MIB * 0.9]
    seen = ", ".join(f"{p}: {mib_text(memory[p])}" for p in pids if p in memory)
    on_server = ", ".join(f"server {p}: {(memory.get(p) or 0) // MIB} MiB" for p in servers if p in memory)
    text = f"clients {seen or 'none listed'}" + (f"; {on_server}" if on_server else "")
    if missing:
        return Row(row_id, name, FAIL, f"client(s) {missing} not in NVML's process list; {text}", numbers)
    if short:
        return Row(row_id, name, FAIL, f"client(s) {short} listed with less than the {alloc_mib} MiB they hold; "
                                       f"{text}", numbers)
    return Row(row_id, name, PASS, f"each client listed with its {alloc_mib} MiB: {text}", numbers)


def mib_text(used: int | None) -> str:
    return "n/a" if used is None else f"{used // MIB} MiB"


def attribution_util_row(row_id: str, name: str, pids: list[int], servers: list[int], util: dict[int, int],
                         numbers: dict[str, Any]) -> Row:
    if "utilization_error" in numbers and not util:
        status = SKIPPED if "Not Supported" in numbers["utilization_error"] else FAIL
        return Row(row_id, name, status, f"nvmlDeviceGetProcessUtilization: {numbers['utilization_error']}", numbers)
    seen = ", ".join(f"{p}: {u}%" for p, u in sorted(util.items()))
    missing = [p for p in pids if util.get(p, 0) <= 0]
    if missing:
        who = "the MPS server" if any(util.get(p, 0) > 0 for p in servers) else "no one"
        return Row(row_id, name, FAIL, f"no SM utilization for client(s) {missing}; samples name {who} "
                                       f"({seen or 'no samples'})", numbers)
    return Row(row_id, name, PASS, f"each spinning client has its own SM utilization: {seen}", numbers)


def charged_to_row(row_id: str, name: str, pids: list[int], servers: list[int], memory: dict[int, int | None],
                   alloc_mib: int, numbers: dict[str, Any]) -> Row:
    """Which way this driver reports an MPS client's memory: on the client (each listed with what it holds) or on its
    server (the clients listed without it, or not at all, and the server holding theirs). Either is a PASS that says
    which; what gpufrac's reclaim does with each is in docs/operations.md. FAIL: the clients' memory is on neither."""
    held = alloc_mib * MIB * 0.9
    on_clients = all((memory.get(p) or 0) >= held for p in pids)
    on_server = sum(memory.get(p) or 0 for p in servers) >= held * len(pids)
    numbers["mps_memory_charged_to"] = "client" if on_clients else "server" if on_server else "neither"
    seen = ", ".join(f"{p}: {mib_text(memory.get(p))}" for p in pids)
    at_server = ", ".join(f"{p}: {mib_text(memory.get(p))}" for p in servers) or "none listed"
    if on_clients:
        return Row(row_id, name, PASS, f"each client: NVML lists each client with its {alloc_mib} MiB ({seen}; "
                                       f"servers {at_server}): reclaim names the pod above its request", numbers)
    if on_server:
        return Row(row_id, name, PASS, f"the MPS server: NVML lists the clients without their memory ({seen}) and "
                                       f"the server with it ({at_server}): reclaim counts it once, against the GPU, "
                                       "and cannot name a victim", numbers)
    return Row(row_id, name, FAIL, f"the clients' {alloc_mib} MiB each is on neither the clients ({seen}) nor the "
                                   f"MPS server ({at_server})", numbers)
