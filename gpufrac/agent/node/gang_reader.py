"""Reading the gangs of reclaim's possible victims from the API server (edge): KAI's PodGroups, and the running
members of their sub-groups (gangs.read_sub_gang). What cannot be read spares its members (fail closed)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from gpufrac.agent.decide.gangs import SUB_GROUP_LABEL, Gang, read_gang, read_sub_gang, unknown_gang
from gpufrac.agent.decide.reclaim import GpuShare, PodFacts
from gpufrac.kube.errors import KubeError

log = logging.getLogger(__name__)


class GangKube(Protocol):
    def get_pod_group(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def list_namespaced_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]: ...


class GangReader:
    def __init__(self, kube: GangKube) -> None:
        self._kube = kube

    def with_gangs(self, facts: Mapping[str, PodFacts], shares: Sequence[GpuShare]) -> dict[str, PodFacts]:
        """The gangs (and sub-groups) of the pods that can be victims now (above their requests on a GPU short of
        memory), read at this pass; one the API server does not answer for spares all of its members."""
        found = dict(facts)
        above = {t.container.pod_uid: t.container.namespace for share in shares if share.shortfall_bytes > 0
                 for t in share.tenants if t.above_request_bytes > 0}
        gangs: dict[tuple[str, str], Gang | None] = {}
        subs: dict[tuple[str, str, str], Gang | None] = {}
        for uid, namespace in above.items():
            pod = facts.get(uid)
            if pod is None or not pod.pod_group:
                continue
            key = (namespace, pod.pod_group)
            if key not in gangs:
                gangs[key] = self._gang(*key)
            gang = gangs[key]
            sub = None
            if gang is not None and pod.sub_group:
                if (*key, pod.sub_group) not in subs:
                    subs[(*key, pod.sub_group)] = read_sub_gang(gang, pod.sub_group, self._members(*key, pod.sub_group))
                sub = subs[(*key, pod.sub_group)]
            found[uid] = replace(pod, gang=gang, sub_gang=sub)
        return found

    def _gang(self, namespace: str, name: str) -> Gang | None:
        try:
            return read_gang(namespace, name, self._kube.get_pod_group(namespace, name))
        except KubeError as err:
            log.warning("reading PodGroup %s/%s: %s; its members are not reclaim victims", namespace, name, err)
            return unknown_gang(namespace, name)

    def _members(self, namespace: str, group: str, sub_group: str) -> list[dict[str, Any]] | None:
        try:
            return self._kube.list_namespaced_pods(namespace, f"{SUB_GROUP_LABEL}={sub_group}")
        except KubeError as err:
            log.warning("listing the pods of sub-group %s of PodGroup %s/%s: %s; its members are not reclaim victims",
                        sub_group, namespace, group, err)
            return None
