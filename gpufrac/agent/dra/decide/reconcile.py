"""The driver's records held against the API server, once a pass (NVIDIA's driver cleans its checkpoint alike). Pure.

- A record whose claim is gone from the API (deleted, or a new claim of the same name: another UID) is a ghost: the
  kubelet will never unprepare it, and it would hold its GPU's memory and mode for ever. It is dropped.
- A claim several pods share is prepared once, for the pods reserved at that first Prepare; the pods that joined
  later are in its `status.reservedFor` now. Their processes are the claim's too (the audit and the daemon's limits
  attribute them to it), so the record takes the pods the API names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpufrac.agent.dra.decide.claims import reserved_pods
from gpufrac.agent.dra.decide.prepare import PreparedClaim


def reconciled(record: PreparedClaim, obj: Mapping[str, Any] | None) -> PreparedClaim | None:
    """The record as the claim now reads (None: a ghost, to drop)."""
    meta = (obj or {}).get("metadata")
    if obj is None or not isinstance(meta, Mapping) or meta.get("uid") != record.claim.uid:
        return None
    reserved = reserved_pods(obj)
    # Those recorded first stay first (the first holds a time-slicing claim: decide.claim_holders).
    pods = tuple(p for p in record.pods if p in reserved) + tuple(p for p in reserved if p not in record.pods)
    # No pod reserved any more: the kubelet unprepares it soon; until then its last pods keep their processes.
    return replace(record, pods=pods) if pods and pods != record.pods else record
