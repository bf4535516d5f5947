"""Which fractional containers a GPU owes memory to: every container of a pod bound to this node, from bind on. Pure.

A pod that allocates its whole request at start (a vLLM server) OOMs while a neighbour is above its request, then
crash-loops. Were only running containers owed, reclaim would never act for it, which is the case the guarantee
exists for. So a container is owed whether it is waiting (being created, pulling, crash-looping) or running. Not
owed: a pod that is going (deleted, or finished: Succeeded, Failed) and a container that has ended and will not run
again (restartPolicy Never, or OnFailure after a clean exit).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpufrac.agent.decide.model import RunningContainer
from gpufrac.agent.decide.proc_text import normalize_container_id
from gpufrac.core.contract import read_canonical

_FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


def _will_not_run_again(status: Mapping[str, Any], restart_policy: object) -> bool:
    terminated = (status.get("state") or {}).get("terminated")
    if terminated is None:
        return False
    if restart_policy == "Never":
        return True
    return restart_policy == "OnFailure" and terminated.get("exitCode") == 0


def pod_is_going(pod: Mapping[str, Any]) -> bool:
    """Deleted already (an eviction under way) or finished: its containers are owed nothing."""
    metadata = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase")
    return bool(metadata.get("deletionTimestamp")) or phase in _FINISHED_PHASES


def owed_containers(pod: Mapping[str, Any]) -> list[RunningContainer]:
    """A bound pod's fractional containers that are owed their requests. A container not started yet has no ID
    (container_id ""): it owns no process, but its request is owed all the same."""
    if pod_is_going(pod):
        return []
    metadata = pod.get("metadata") or {}
    fractions = read_canonical(metadata.get("annotations") or {}).fractions
    restart_policy = (pod.get("spec") or {}).get("restartPolicy")  # unset: Always
    statuses = {s.get("name"): s for s in (pod.get("status") or {}).get("containerStatuses") or []}
    result = []
    for name, fraction in sorted(fractions.items()):
        status = statuses.get(name) or {}
        if _will_not_run_again(status, restart_policy):
            continue
        container_id = status.get("containerID")
        result.append(RunningContainer(
            namespace=str(metadata.get("namespace", "")),
            pod=str(metadata.get("name", "")),
            pod_uid=str(metadata.get("uid", "")),
            container=name,
            container_id=normalize_container_id(container_id) if container_id else "",
            fraction=fraction,
        ))
    return result


def owed_on_node(pods: Iterable[Mapping[str, Any]]) -> list[RunningContainer]:
    """Every owed container of the node's pods (the agent's pod list holds only pods bound to its node)."""
    return [c for pod in pods for c in owed_containers(pod)]
