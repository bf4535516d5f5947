"""The rule `unknownContainers`: the reader that finds it (`reads`), its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.cel import regex
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.values import (
    KAI,
    NV,
    container_of,
    well_formed,
)


def cel() -> str:
    kept = f"(k.matches({regex(well_formed(NV))}) || k.matches({regex(well_formed(KAI))}))"
    return (f"variables.prefixedKeys.filter(k, {kept} && !({container_of('k')} in variables.names))"
            f".map(k, 'annotation ' + k + ': names container ' + {container_of('k')} + ', but the pod has ' + "
            "variables.listing)")


RULE = Rule(
    "unknownContainers", "a per-container key names a container of the pod",
    Scope.POD, Phase.VALUE, 20,
    None,
    cel(),
    reads=fr.read_container_keys,
)
