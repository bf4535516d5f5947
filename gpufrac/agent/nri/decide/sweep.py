"""Which containers the NRI plugin stops once it is back after being away (the escape matrix's row 9). Pure.

While the plugin is away (the agent restarting, or an answer later than the runtime's deadline), containerd creates
containers without it: NRI fails open. A fraction then starts without the CDI device the plugin gives (and the
toolkit's hooks on it), with only the env the webhook wrote, which NVIDIA's runtime may turn into its whole GPU
without limits. On the next Synchronize the plugin finds them: a live container of a fraction bound to a GPU,
created after the plugin was last known present (less a slack: the runtime's deadline and the heartbeat's period),
and not carrying the plugin's mark (`MARK`, the annotation its adjustment adds to each fraction it serves). The
plugin stops each, as KAI's node plugin does, and the kubelet creates it again, through the plugin. A container
created before the window is never stopped: it came through a plugin, possibly one from before the mark.

A container that is no fraction, created in the window, is stopped too where the plugin, judging it now
(`creation.decide`), would have voided its GPU grant or refused it: its env may have given it a GPU without limits
(NVIDIA_VISIBLE_DEVICES=all under NVIDIA's runtime). One the plugin voided shows its grant void and is judged
untouched; the GPU stack's own keep their env and are never stopped.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpufrac.agent.nri.decide.creation import MARK, ContainerInfo, Outcome, PodInfo
from gpufrac.core.contract import read_canonical

REASON = "GPUCreatedWithoutPlugin"  # the Event's reason on the pod

Judge = Callable[[PodInfo, ContainerInfo], Outcome]  # what the plugin would do with a container's creation now


@dataclass(frozen=True)
class Unserved:
    """A fraction created while the plugin was away: to be stopped, and why (one line; the plugin adds what it
    did, for the Event)."""

    pod: PodInfo
    container: ContainerInfo
    message: str


def _stamp(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def unserved(live: Iterable[tuple[PodInfo, ContainerInfo]], away_since: float | None,
             judge: Judge | None = None) -> list[Unserved]:
    """The live containers to stop. `away_since`: when the plugin was last known present, less the slack (None: not
    known, as on a node where no plugin ran before: nothing is stopped). `judge`: the plugin's decision on a
    container that is no fraction (None: such containers are left alone)."""
    if away_since is None:
        return []
    found = []
    for pod, container in live:
        if MARK in container.annotations or container.created_at <= away_since:
            continue
        fraction = read_canonical(pod.annotations).fractions.get(container.name)
        if fraction is None:
            why = _plain_unserved(pod, container, judge)
        elif fraction.devices:
            why = (f"is a {fraction.mode} GPU fraction", "it was not given its GPU's device and limits by the plugin")
        else:
            why = None  # not bound yet: it holds no GPU
        if why is not None:
            found.append(Unserved(pod, container, (
                f"container {container.name} of pod {pod} {why[0]} created at {_stamp(container.created_at)}, while "
                f"the gpufrac NRI plugin was away (from about {_stamp(away_since)}): {why[1]}")))
    return found


def _plain_unserved(pod: PodInfo, container: ContainerInfo, judge: Judge | None) -> tuple[str, str] | None:
    outcome = judge(pod, container) if judge is not None else Outcome.UNTOUCHED
    if outcome is Outcome.VOIDED:
        return ("is no GPU fraction and its env asks for a GPU; it was",
                "its env may have given it a GPU without limits, which the plugin voids")
    if outcome is Outcome.REFUSED:
        return ("is no GPU fraction, and the plugin refuses its creation; it was",
                "it may hold a GPU without limits")
    return None
