"""From what each container's keys ask for to its fraction (`build_fractions`), and the container a portion is for,
found by reading alone (`portion_container`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufrac.core import annotations as ann
from gpufrac.core.contract import mib_ceil
from gpufrac.webhook.decide import pod as podview
from gpufrac.webhook.decide.fractions.model import (
    ContainerFraction,
    ContainerRequest,
    Containers,
    Memory,
    PodRequest,
    Portion,
    Target,
)
from gpufrac.webhook.decide.fractions.read import (
    read_container_keys,
    read_containers,
    read_fraction,
    read_shorthands,
    read_target,
)


def _memory(entry: ContainerRequest) -> Memory | None:
    """Request and limit in whole MiB, each defaulting to the other (KAI: defaultRequestFromLimit)."""
    request = entry.request or entry.limit
    limit = entry.limit or entry.request
    if request is None or limit is None:
        return None
    return Memory(mib_ceil(request.bytes), mib_ceil(limit.bytes))


def build_fractions(requests: Mapping[str, ContainerRequest], request: PodRequest, target: Target,
                    containers: Containers) -> dict[str, ContainerFraction]:
    result: dict[str, ContainerFraction] = {}
    for name in containers.names:
        entry = requests.get(name)
        portion = (Portion(request.fraction, entry.portion_limit if entry else None)
                   if request.fraction is not None and name == target.container else None)
        memory = _memory(entry) if entry is not None else None
        if memory is None and portion is None:
            continue
        result[name] = ContainerFraction(
            container=name,
            mode=(entry.mode if entry else None) or ann.DEFAULT_MODE,
            num_devices=request.num_devices,
            memory=memory,
            portion=portion,
            devices=entry.devices if entry else (),
            compute_portion=entry.compute_portion if entry else None,
        )
    return result


def portion_container(obj: dict[str, Any]) -> str | None:
    """The container whose fraction is a portion (a valid gpu-fraction's target), as `resolve` finds it, without
    reading the rest: what the scheduler may write memory for at bind."""
    annotations = podview.annotations(obj)
    containers = read_containers(obj)
    text = annotations.get(ann.FRACTION)
    if text is None or read_fraction(ann.FRACTION, text)[0] is None:
        return None
    keys, _ = read_container_keys(annotations, containers)
    return read_target(read_shorthands(annotations), containers, keys)[0].container
