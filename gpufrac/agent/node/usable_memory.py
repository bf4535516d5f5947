"""The usable memory of each GPU, measured at each pass (edge): what requests may fill, published as a node label per
GPU model (decide.capacity: total less the driver's reserve and the MPS servers' contexts)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from gpufrac.agent.decide import capacity
from gpufrac.agent.decide.errors import ProcReadError
from gpufrac.agent.decide.model import GpuMemory, GpuProcess, Inventory
from gpufrac.agent.edges.procfs import read_cgroup, read_parent_pid
from gpufrac.core.contract import mib_floor


class UsableMemory:
    def __init__(self, proc_root: Any, clock: Callable[[], float], mps_daemons: Callable[[], Iterable[int]],
                 keep_seconds: float) -> None:
        self._proc_root = proc_root
        self._clock = clock
        self._mps_daemons = mps_daemons  # the PIDs of the MPS control daemons the agent runs or supervises
        self._keep_seconds = keep_seconds  # how long a larger MPS context figure outlives smaller readings
        self._mps_context: dict[str, capacity.Remembered] = {}  # the most each GPU's MPS servers were seen holding
        self.labels: dict[str, str] = {}  # the usable-memory labels, published with the agent's others
        self.usable_mib: dict[str, int] = {}  # GPU UUID -> usable memory as of the last pass (what requests may fill)

    def measure(self, inventory: Inventory, memory: Mapping[str, GpuMemory],
                processes: Sequence[GpuProcess]) -> list[capacity.Usable]:
        """Usable memory per GPU; the labels are kept for the next publish. The MPS servers are the agent's own
        daemons' children (or in their cgroups), whatever any process calls itself; their context is remembered
        at its largest, a maximum that decays (`capacity.remember_contexts`)."""
        held = capacity.mps_contexts(processes, self.mps_servers(processes))
        self._mps_context = capacity.remember_contexts(self._mps_context, held, self._clock(),
                                                       self._keep_seconds)
        usable = capacity.usable(inventory.gpus, memory, {u: r.held_bytes for u, r in self._mps_context.items()})
        self.labels = capacity.usable_labels(usable)
        self.usable_mib = {u.gpu.uuid: mib_floor(u.usable_bytes) for u in usable}
        return usable

    def mps_servers(self, processes: Sequence[GpuProcess]) -> list[int]:
        daemons = {pid for pid in self._mps_daemons() if pid}
        daemon_cgroups = set()
        for pid in daemons:
            try:
                daemon_cgroups.add(read_cgroup(self._proc_root, pid))
            except ProcReadError:
                continue  # not visible from here: its children are still known by their parent
        servers = []
        for process in processes:
            try:
                if read_parent_pid(self._proc_root, process.pid) in daemons or \
                        read_cgroup(self._proc_root, process.pid) in daemon_cgroups:
                    servers.append(process.pid)
            except ProcReadError:
                continue  # exited meanwhile
        return servers
