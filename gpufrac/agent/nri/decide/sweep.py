"""Which containers the NRI plugin stops once it is back after being away (the escape matrix's row 9). Pure.

While the plugin is away (the agent restarting, or an answer later than the runtime's deadline), containerd creates
containers without it: NRI fails open. A fraction then starts without the CDI device the plugin gives (and the
toolkit's hooks on it), with only the env the webhook wrote, which NVIDIA's runtime may turn into its whole GPU
without limits. On the next Synchronize the plugin finds them: a live container of a fraction bound to a GPU,
created after the plugin was last known present (less a slack: the runtime's deadline and the heartbeat's period),
and not carrying the plugin's mark (`MARK`, the annotation its adjustment adds to each fraction it serves). The
plugin stops each, as KAI's node plugin does, and the kubelet creates it again, through the plugin. A container
created before the window is never stopped: it came through a plugin, possibly one from before the mark.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from gpufrac.agent.nri.decide.creation import MARK, ContainerInfo, PodInfo
from gpufrac.core.contract import read_canonical

REASON = "GPUCreatedWithoutPlugin"  # the Event's reason on the pod


@dataclass(frozen=True)
class Unserved:
    """A fraction created while the plugin was away: to be stopped, and why (one line; the plugin adds what it
    did, for the Event)."""

    pod: PodInfo
    container: ContainerInfo
    message: str


def _stamp(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def unserved(live: Iterable[tuple[PodInfo, ContainerInfo]], away_since: float | None) -> list[Unserved]:
    """The live containers to stop. `away_since`: when the plugin was last known present, less the slack (None: not
    known, as on a node where no plugin ran before: nothing is stopped)."""
    if away_since is None:
        return []
    found = []
    for pod, container in live:
        fraction = read_canonical(pod.annotations).fractions.get(container.name)
        if fraction is None or not fraction.devices or MARK in container.annotations:
            continue
        if container.created_at <= away_since:
            continue
        found.append(Unserved(pod, container, (
            f"container {container.name} of pod {pod} is a {fraction.mode} GPU fraction created at "
            f"{_stamp(container.created_at)}, while the gpufrac NRI plugin was away (from about "
            f"{_stamp(away_since)}): it was not given its GPU's device and limits by the plugin")))
    return found

