"""A time-slicing claim serves one pod. Pure.

The kubelet prepares a claim once, however many pods it is reserved for, and each container that names its CDI
device gets the claim's whole limit: the toolkit's hook and the CUDA limit hold per process, so two pods sharing a
time-slicing claim could use twice its memory. The first pod the claim was prepared for (then the first of those
that joined later, once it leaves) holds it; a container of any other pod is refused at creation, telling its owner
to give each pod a claim of its own (a ResourceClaimTemplate). The NRI plugin knows a claim's container by the
claim's CDI device (told from containerd 2.2) or the env its CDI spec sets (`GPUFRAC_DRA_CLAIM`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpufrac.agent.decide.dra_prepare import CDI_KIND, CLAIM_ENV, PreparedClaim
from gpufrac.core.annotations import ComputeMode


@dataclass(frozen=True)
class ClaimHolder:
    claim: str  # namespace/name
    pod_uid: str
    pod: str  # its name


def time_slicing_holders(claims: Iterable[PreparedClaim]) -> dict[str, ClaimHolder]:
    """Claim UID -> the pod its time-slicing share serves (claims without a pod recorded are not judged)."""
    return {c.claim.uid: ClaimHolder(f"{c.claim.namespace}/{c.claim.name}", c.pods[0].uid, c.pods[0].name)
            for c in claims if c.pods and any(d.mode == ComputeMode.TIME_SLICING and not d.admin for d in c.devices)}


def _claims_named(env: Mapping[str, str], cdi_devices: Iterable[str]) -> set[str]:
    named = {env[CLAIM_ENV]} if env.get(CLAIM_ENV) else set()
    prefix = f"{CDI_KIND}="
    # `<claim uid>-<device>`: a claim's UID is a UUID, 36 characters
    return named | {name[len(prefix):len(prefix) + 36] for name in cdi_devices if name.startswith(prefix)}


def shared_claim_refusal(pod_uid: str, env: Mapping[str, str], cdi_devices: Iterable[str],
                         holders: Mapping[str, ClaimHolder]) -> str | None:
    for uid in sorted(_claims_named(env, cdi_devices)):
        holder = holders.get(uid)
        if holder is not None and holder.pod_uid != pod_uid:
            return (f"it uses time-slicing claim {holder.claim}, which serves pod {holder.pod}: each pod of a "
                    "time-slicing claim would get the claim's whole memory limit, so a claim serves one pod; give "
                    "each pod a claim of its own (spec.resourceClaims[].resourceClaimTemplateName, a "
                    "ResourceClaimTemplate)")
    return None
