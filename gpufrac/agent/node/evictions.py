"""Every eviction the agent's guarantee makes (edge): over-limit `evict` and reclaim alike.

One eviction per pod per pass, whichever GPU or action asks for it (`this_pass`: over-limit evicts first, and
reclaim counts those pods, and its own, as going) (a second would double its Events, metrics and
back-off, and a second GPU might evict a younger pod for memory already being freed). Each names the pod's UID as a
precondition (a pod of the same name created since is not evicted) and gives it `reclaim.victimGracePeriodSeconds`
(a bound on how long its memory takes to come back). A pod with a controller gets its back-off label on the node
first; where that label cannot be written, the pod is not evicted (fail closed): an Event says so.
"""

from __future__ import annotations

import logging
from typing import Protocol

from gpufrac.agent.decide.model import EvictionOutcome
from gpufrac.agent.node.backoffs import BackoffNotWrittenError, Backoffs
from gpufrac.core.owners import Owner
from gpufrac.kube.errors import KubeError

log = logging.getLogger(__name__)

Eviction = tuple[EvictionOutcome | None, str]  # what the Eviction API said (None: not evicted, failed), its words


class EvictionApi(Protocol):
    def request_eviction(self, namespace: str, name: str, *, uid: str = "",
                         grace_seconds: int | None = None) -> tuple[EvictionOutcome, str]: ...


class Evictions:
    def __init__(self, kube: EvictionApi, backoffs: Backoffs, grace_seconds: int | None) -> None:
        self._kube = kube
        self.backoffs = backoffs
        self._grace_seconds = grace_seconds  # None: the pod's own terminationGracePeriodSeconds
        self.this_pass: set[str] = set()  # pod UIDs evicted (or found gone) in this pass

    def new_pass(self) -> None:
        self.this_pass = set()

    def evict(self, namespace: str, name: str, uid: str, owner: Owner | None = None) -> Eviction:
        """Evict; with `owner`, its back-off on the node first (None: no back-off, e.g. a claim's pod, whose pods
        carry no affinity to honour it). A pod evicted (or found gone) joins `this_pass`, which reclaim's loop counts
        as going: it is not asked for again in this pass."""
        try:
            outcome, said = self.backoffs.evict(owner, lambda: self._request(namespace, name, uid))
        except BackoffNotWrittenError as err:
            log.warning("not evicting %s/%s: %s", namespace, name, err)
            return EvictionOutcome.NOT_KEPT_OFF, str(err)
        if outcome in (EvictionOutcome.EVICTED, EvictionOutcome.GONE):
            self.this_pass.add(uid)
        return outcome, said

    def _request(self, namespace: str, name: str, uid: str) -> Eviction:
        try:
            return self._kube.request_eviction(namespace, name, uid=uid, grace_seconds=self._grace_seconds)
        except KubeError as err:
            log.warning("evicting %s/%s: %s", namespace, name, err)
            return None, str(err)
