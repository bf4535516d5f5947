"""The DRA driver's record of the claims it prepared, as the state file holds it (JSON). Pure.

The kubelet calls Prepare again for a claim it was told about but did not see answered, and Unprepare for a claim
the agent may have prepared before it restarted: the record is what lets a restarted agent answer both (Prepare
returns the recorded devices, Unprepare finds the spec to remove) and what the mode backstop checks against.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from gpufrac.agent.dra.decide.claims import ClaimPod, ClaimRef
from gpufrac.agent.dra.decide.prepare import PreparedClaim, PreparedDevice

STATE_VERSION = 1


class StateError(ValueError):
    """The state file does not read; the message says where."""


def dump(claims: Iterable[PreparedClaim]) -> str:
    records = [{"claim": asdict(c.claim), "devices": [asdict(d) for d in c.devices],
                "pods": [asdict(p) for p in c.pods]}
               for c in sorted(claims, key=lambda c: c.claim.uid)]
    return json.dumps({"version": STATE_VERSION, "claims": records}, indent=1, sort_keys=True) + "\n"


def _device(raw: dict[str, Any]) -> PreparedDevice:
    return PreparedDevice(**{**raw, "cdi_ids": tuple(raw["cdi_ids"]), "env": tuple(raw.get("env", ()))})


def load(text: str) -> dict[str, PreparedClaim]:
    """The prepared claims by UID."""
    try:
        data = json.loads(text)
        if data.get("version") != STATE_VERSION:
            raise StateError(f"state version {data.get('version')!r}, this agent reads {STATE_VERSION}")
        # `pods` and a device's `env` came later within version 1: a record without them reads as ()
        claims = [PreparedClaim(ClaimRef(**raw["claim"]), tuple(_device(d) for d in raw["devices"]),
                                tuple(ClaimPod(**pod) for pod in raw.get("pods", ())))
                  for raw in data["claims"]]
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise StateError(f"the prepared claims do not read: {err}") from err
    return {claim.claim.uid: claim for claim in claims}
