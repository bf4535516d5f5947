"""The reclaim back-off: after the agent evicts a pod that has a controller, that controller's fractional pods are
kept off this node for `reclaim.backoffSeconds`, so its replacement is not placed on the same GPU, grows and is
evicted again. The node carries a label per controller (contract.reclaim_backoff_label, its value the end in epoch
seconds) that the node affinity the webhook gives each such pod fails on. The label goes on before the eviction (the
controller creates the replacement at once), and comes off when the eviction did not happen or the back-off ends.
The node's labels are the state: a restarted agent adopts the ones it finds. Where the label cannot be written, the
pod is not evicted (`BackoffNotWrittenError`): its replacement would land on the same GPU and be evicted in turn.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gpufrac.agent.decide.model import EvictionOutcome
from gpufrac.core.contract import RECLAIM_BACKOFF_PREFIX, reclaim_backoff_label
from gpufrac.core.owners import Owner

Eviction = tuple[EvictionOutcome | None, str]  # what the Eviction API said (None: the call failed), and its words


class BackoffNotWrittenError(Exception):
    """The back-off label could not be put on the node: the eviction was not asked for."""


class Backoffs:
    def __init__(self, seconds: float, wall_clock: Callable[[], float], publish: Callable[[], bool]) -> None:
        self._seconds = seconds  # 0: no back-off
        self._wall_clock = wall_clock
        self._publish = publish  # the node's labels with the back-offs as they are now, between two ticks
        self._until: dict[str, float] = {}  # node label -> when its back-off ends, epoch seconds

    def evict(self, owner: Owner | None, evict: Callable[[], Eviction]) -> Eviction:
        """`evict`, with the owner's back-off on the node first; taken off again where it did not evict. Raises
        BackoffNotWrittenError, evicting nothing, when the node's labels could not be written."""
        if owner is None or self._seconds <= 0:
            return evict()
        label = reclaim_backoff_label(owner.uid)
        before = self._until.get(label)
        self._until[label] = self._wall_clock() + self._seconds
        if not self._publish():
            self._restore(label, before)
            raise BackoffNotWrittenError(
                f"the node's back-off label {label} for {owner.kind} {owner.name} could not be written, so its next "
                "pod could be placed on this GPU again: not evicted (tried again later)")
        outcome, said = evict()
        if outcome is not EvictionOutcome.EVICTED:
            self._restore(label, before)
            self._publish()
        return outcome, said

    def _restore(self, label: str, before: float | None) -> None:
        if before is None:
            self._until.pop(label, None)
        else:
            self._until[label] = before

    def until(self, owner: Owner) -> float | None:
        """When the owner's back-off ends (None: it has none)."""
        return self._until.get(reclaim_backoff_label(owner.uid))

    def labels(self) -> dict[str, str]:
        """The node labels of the back-offs still running."""
        now = self._wall_clock()
        self._until = {label: until for label, until in self._until.items() if until > now}
        return {label: str(int(until)) for label, until in sorted(self._until.items())}

    def adopt(self, node_labels: Mapping[str, str]) -> None:
        """The back-offs an earlier agent left on the node, kept until they end."""
        for label, value in node_labels.items():
            if label.startswith(RECLAIM_BACKOFF_PREFIX) and value.isdigit():
                self._until.setdefault(label, float(value))
