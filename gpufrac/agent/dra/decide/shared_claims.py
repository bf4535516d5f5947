"""Who holds each time-slicing claim this node prepared (a claim serves one pod: decide.claim_holders). Pure."""

from __future__ import annotations

from collections.abc import Iterable

from gpufrac.agent.decide.claim_holders import ClaimHolder
from gpufrac.agent.dra.decide.prepare import PreparedClaim
from gpufrac.core.annotations import ComputeMode


def time_slicing_holders(claims: Iterable[PreparedClaim]) -> dict[str, ClaimHolder]:
    """Claim UID -> the pod its time-slicing share serves (claims without a pod recorded are not judged)."""
    return {c.claim.uid: ClaimHolder(f"{c.claim.namespace}/{c.claim.name}", c.pods[0].uid, c.pods[0].name, gpus)
            for c in claims if c.pods and (gpus := tuple(d.gpu_uuid for d in c.devices
                                                         if d.mode == ComputeMode.TIME_SLICING and not d.admin))}
