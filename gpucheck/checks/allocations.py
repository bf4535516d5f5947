"""Rows 11a-11d, the rest of escape 10 of docs/security.md's matrix: device memory a tenant allocates otherwise
than with cuMemAlloc (what cudaMalloc calls, rows 2, 3, 9 and 10) counts against its limit all the same.

- VMM: physical memory from cuMemCreate, mapped into a range from cuMemAddressReserve (cuMemMap, cuMemSetAccess),
  each chunk its own range, as NCCL allocates (PyTorch's expandable segments and JAX too);
- pools: cuMemAllocAsync on stream 0 from the device's default stream-ordered pool, what cudaMallocAsync calls.

NCCL's buffers need no row of their own (and there is no NCCL on the node: the check installs nothing): with
NCCL_CUMEM_ENABLE, on by default since NCCL 2.19, NCCL allocates them with cuMemCreate (the VMM rows), and without it
with cudaMalloc (rows 2, 3, 9, 10).

- 11a, 11b: the CUDA 13.4 limits (NVIDIA_GPU_MEMORY_REQUEST/LIMIT applied to each client's own cgroup through NVML,
  as the toolkit's hook does, exactly as row 3a), no MPS: two clients at once (A, 2A) allocating through VMM (11a) or
  the pool (11b), each held to its cgroup's hard limit;
- 11c, 11d: the sm-sharing daemon's own pinned limit A (told as rows 9 tell it), one client with no pinned env at all
  allocating through VMM (11c) or the pool (11d), held to A.

A client allocates (and touches) chunks that way until it is refused; the row PASSes when it is refused at its
limit with CUDA_ERROR_OUT_OF_MEMORY (gpucheck/judge.py's judge_probe, as rows 2 and 3). SKIPPED where the node lacks
what rows 3 (11a, 11b) or rows 9 (11c, 11d) need, or where the device does not allocate that way (the client, in
its own context, finds CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED or _MEMORY_POOLS_SUPPORTED 0, or the
first allocation gets CUDA_ERROR_NOT_SUPPORTED).

11a and 11b run after row 3a, before any MPS server holds the GPU; 11c and 11d last, after row 10, leaving the
daemon's limit at A.
"""

from __future__ import annotations

from gpucheck.checks.daemons import Daemons
from gpucheck.checks.escapes import DaemonSideLimits
from gpucheck.checks.memory import MemoryLimits
from gpucheck.client.allocations import POOL, VMM
from gpucheck.contract import SM_SHARING
from gpucheck.session import Session

KIND_NAMES = {VMM: "VMM (cuMemCreate)", POOL: "pool (cudaMallocAsync)"}
CGROUP_VMM = "11a", f"13.4 limits: {KIND_NAMES[VMM]}"
CGROUP_POOL = "11b", f"13.4 limits: {KIND_NAMES[POOL]}"
DAEMON_VMM = "11c", f"daemon-side limit: {KIND_NAMES[VMM]}"
DAEMON_POOL = "11d", f"daemon-side limit: {KIND_NAMES[POOL]}"


class OtherAllocations:
    def __init__(self, session: Session, daemons: Daemons, memory: MemoryLimits,
                 daemon_side: DaemonSideLimits) -> None:
        self.s = session
        self.daemons = daemons
        self.memory = memory
        self.daemon_side = daemon_side

    def cgroup_rows(self) -> None:
        """11a, 11b: as row 3a (no MPS), the clients allocating through VMM, then through the pool."""
        for (row_id, name), kind in ((CGROUP_VMM, VMM), (CGROUP_POOL, POOL)):
            self.s.guarded(row_id, lambda row_id=row_id, name=name, kind=kind: self.memory.driver(
                row_id, None, kind, name))

    def daemon_rows(self) -> None:
        """11c, 11d: the sm-sharing daemon told A, a client without pinned env allocating through VMM, then one
        through the pool."""
        s = self.s
        reason = self.daemon_side.problem()  # CUDA, the sm-sharing daemon up, the GPU's UUID: as rows 9
        if reason:
            s.skip((DAEMON_VMM, DAEMON_POOL), reason)
            return
        a, _ = s.node.limits()
        for (row_id, name), kind in ((DAEMON_VMM, VMM), (DAEMON_POOL, POOL)):
            s.guarded(row_id, lambda row_id=row_id, name=name, kind=kind: self.daemon_row(row_id, name, kind, a))

    def daemon_row(self, row_id: str, name: str, kind: str, a: int) -> None:
        said = self.daemon_side.tell(a)
        client = self.memory.probe_client(f"daemon-{kind}", a, self.daemons.pipe_dir(SM_SHARING), {},
                                          {"probe_kind": kind})
        self.memory.row(row_id, name, [client], (a,), {"daemon": said, "env": None, "kind": kind},
                        f"the daemon at {a} MiB, no pinned env: ")
