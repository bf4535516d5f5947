"""Row 10, a DRA claim's limit holds: a CUDA client run as a container that gpufrac's DRA driver (`gpu.gpufrac.io`)
prepared for an sm-sharing claim runs, on the check's own sm-sharing daemon.

The claim: a quarter of the GPU's memory (request = limit: no GpuConfig `memoryLimit`) and a quarter of its SM
threads (`compute: 25`) on the GPU's sm-sharing device. The client gets the env Prepare writes into the claim's CDI
spec (`contract.claim_env`: the request and limit in MiB, the pipe directory, the pinned limit keyed by the GPU's
UUID, the thread percentage; tests/gpucheck asserts it is what gpufrac.agent.dra.decide.prepare gives the same claim
on the same GPU), and the daemon is told what the agent's loop tells it for that claim alone (its limit and thread
percentage, decide.mps_limits). The client allocates in chunks until it is refused: the allocations below the
claim's limit succeed and the one that would pass it gets CUDA_ERROR_OUT_OF_MEMORY; one past it FAILs the row.

Not emulated: the toolkit's apply-cuda-memory-limits hook on the container's cgroup (rows 3 check those limits, 8b
the hook), and the mounts (the client reaches the pipe directory at its host path; rows 5 check a pod through them).

It runs after rows 9: it tells the daemon the claim's limits, which the daemon keeps until it stops.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from gpucheck.checks.daemons import Daemons
from gpucheck.checks.escapes import DaemonSideLimits
from gpucheck.checks.memory import MemoryLimits
from gpucheck.contract import SM_SHARING, claim_env
from gpucheck.rows import FAIL, SKIPPED, Row
from gpucheck.session import Session

CLAIM_ROW = "10", "DRA claim: its limit holds"
CLAIM_SHARE = 4  # the claim asks 1/CLAIM_SHARE of the GPU's memory
CLAIM_COMPUTE = 25  # and this percentage of its SM threads


@dataclass(frozen=True)
class Claim:
    """An sm-sharing claim as Prepare reads it: its consumed memory (the request), its limit, its consumed compute."""

    request_mib: int
    limit_mib: int
    compute_percent: int


def quarter_claim(total_mib: int) -> Claim:
    """The row's claim on a GPU of `total_mib` (1 GiB where NVML gave no total)."""
    mib = total_mib // CLAIM_SHARE if total_mib else 1024
    return Claim(mib, mib, CLAIM_COMPUTE)


class DraClaim:
    def __init__(self, session: Session, daemons: Daemons, memory: MemoryLimits,
                 daemon_side: DaemonSideLimits) -> None:
        self.s = session
        self.daemons = daemons
        self.memory = memory
        self.daemon_side = daemon_side

    def run(self) -> None:
        s = self.s
        row_id, name = CLAIM_ROW
        reason = self.daemon_side.problem()  # CUDA, the sm-sharing daemon up, the GPU's UUID: as rows 9
        uuid = s.node.gpu_uuid
        if reason or uuid is None:
            s.add(Row(row_id, name, SKIPPED, reason or "no GPU UUID"))
            return
        claim = quarter_claim(s.node.gpu_total_mib)
        pipe = self.daemons.pipe_dir(SM_SHARING)
        env = claim_env(uuid, pipe, claim.request_mib, claim.limit_mib, claim.compute_percent)
        numbers = {"claim": {"gpu": uuid, "gpu_total_mib": s.node.gpu_total_mib, "request_mib": claim.request_mib,
                             "limit_mib": claim.limit_mib, "compute_percent": claim.compute_percent}, "env": env}
        try:
            numbers["daemon"] = self.daemon_side.tell(claim.limit_mib, claim.compute_percent)
        except (RuntimeError, OSError, subprocess.SubprocessError) as err:
            s.add(Row(row_id, name, FAIL, f"the sm-sharing daemon did not take the claim's limits: {err}", numbers))
            return
        client = self.memory.probe_client("dra-claim", claim.limit_mib, pipe, env)
        lead = (f"claim {claim.request_mib} MiB, limit {claim.limit_mib} MiB, {claim.compute_percent}% threads "
                f"(GPU {s.node.gpu_total_mib} MiB), Prepare's env and the agent's daemon limits: ")
        self.memory.row(row_id, name, [client], (claim.limit_mib,), numbers, lead)
