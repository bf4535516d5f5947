"""A time-slicing claim serves one pod: who holds each claim's share, and the judgement of a container that names one
at its creation. Pure; part of the node core because the DRA door prepares claims (its `shared_claims` says who
holds them) and the NRI door creates their containers.

The kubelet prepares a claim once, however many pods it is reserved for, and each container that names its CDI
device gets the claim's whole limit: the toolkit's hook and the CUDA limit hold per process, so two pods sharing a
time-slicing claim could use twice its memory. The first pod the claim was prepared for (then the first of those
that joined later, once it leaves) holds it; a container of any other pod is refused at creation, telling its owner
to give each pod a claim of its own (a ResourceClaimTemplate). The NRI plugin knows a claim's container by the
claim's CDI device (told from containerd 2.2) or the env its CDI spec sets (`GPUFRAC_DRA_CLAIM`).

Its holder's container is then a client of the node's time-slicing MPS daemon like an annotated fraction's: where
that daemon serves one user at a time (no `-m`), a claim's container of another UID than the one it serves is
refused (creation_escapes.mps_user_conflict), and the container counts among those it serves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from gpufrac.agent.decide.creation_escapes import mps_user_conflict
from gpufrac.core.annotations import ComputeMode

DRA_DRIVER = "gpu.gpufrac.io"  # the agent's DRA driver: its DeviceClass's and ResourceSlices' driver name
CLAIM_CDI_KIND = f"{DRA_DRIVER}/claim"  # the kind of the CDI specs the DRA driver writes per prepared claim
CLAIM_ENV = "GPUFRAC_DRA_CLAIM"  # a time-slicing claim's UID in its container, set by its CDI spec


@dataclass(frozen=True)
class ClaimHolder:
    claim: str  # namespace/name
    pod_uid: str
    pod: str  # its name
    gpus: tuple[str, ...] = ()  # the GPUs (UUIDs) of its time-slicing share


def _claims_named(env: Mapping[str, str], cdi_devices: Iterable[str]) -> set[str]:
    named = {env[CLAIM_ENV]} if env.get(CLAIM_ENV) else set()
    prefix = f"{CLAIM_CDI_KIND}="
    # `<claim uid>-<device>`: a claim's UID is a UUID, 36 characters
    return named | {name[len(prefix):len(prefix) + 36] for name in cdi_devices if name.startswith(prefix)}


@dataclass(frozen=True)
class ClaimVerdict:
    """A time-slicing claim's container: refused (`refusal`, and whether for its user), or served on `gpus`."""

    gpus: tuple[str, ...]
    refusal: str | None = None
    user_conflict: bool = False


class Created(Protocol):
    """The container being created, as the NRI plugin knows it (nri.decide.creation.ContainerInfo)."""

    @property
    def env(self) -> Mapping[str, str]: ...

    @property
    def cdi_devices(self) -> tuple[str, ...]: ...

    @property
    def uid(self) -> int | None: ...


class Client(Protocol):
    """A container the NRI plugin serves (nri.decide.creation.ServingContainer)."""

    @property
    def container_id(self) -> str: ...

    @property
    def namespace(self) -> str: ...

    @property
    def pod(self) -> str: ...

    @property
    def container(self) -> str: ...

    @property
    def mode(self) -> ComputeMode: ...

    @property
    def uid(self) -> int | None: ...


def clients(serving: Iterable[Client], mode: ComputeMode, but: str) -> list[tuple[int | None, str]]:
    """The mode's served containers but container `but`, as (UID, who)."""
    return [(s.uid, f"container {s.container} of pod {s.namespace}/{s.pod}") for s in serving
            if s.mode is mode and s.container_id != but]


def claim_container(pod_uid: str, container: Created, holders: Mapping[str, ClaimHolder],
                    single_user: Iterable[tuple[int | None, str]] | None) -> ClaimVerdict | None:
    """None: no time-slicing claim of this node's. `single_user`: the time-slicing daemon's other clients (UID, who)
    where it serves one user at a time; None where it serves every UID."""
    uid = container.uid
    found = [holders[u] for u in sorted(_claims_named(container.env, container.cdi_devices)) if u in holders]
    if not found:
        return None
    gpus = tuple(g for holder in found for g in holder.gpus)
    other = next((h for h in found if h.pod_uid != pod_uid), None)
    if other is not None:
        return ClaimVerdict(gpus, f"it uses time-slicing claim {other.claim}, which serves pod {other.pod}: each pod "
                            "of a time-slicing claim would get the claim's whole memory limit, so a claim serves one "
                            "pod; give each pod a claim of its own (spec.resourceClaims[].resourceClaimTemplateName, "
                            "a ResourceClaimTemplate)")
    held = mps_user_conflict(uid, single_user) if single_user is not None else None
    if held is not None:
        return ClaimVerdict(gpus, f"it uses time-slicing claim {found[0].claim} and runs as UID {uid}, but this node's "
                            f"time-slicing MPS daemon serves one user at a time and serves {held}: MPS would hold its "
                            "CUDA calls until every client of that UID has exited; run it as that UID "
                            "(securityContext.runAsUser), or on another node", user_conflict=True)
    return ClaimVerdict(gpus)
