"""What a rule is: the requests it judges, where its messages go in a denial, the webhook's Python that evaluates
it, and the CEL that carries it in the ValidatingAdmissionPolicies (or why none does).

Pure. Each rule is one module of `rules/catalog/`, holding its `RULE`; `table` gathers them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Scope(Enum):
    """The requests a rule judges: a pod's CREATE and UPDATE (CREATE/UPDATE: one of them), pods/status, pods/binding."""

    POD = "pods"
    CREATE = "pods (CREATE)"
    UPDATE = "pods (UPDATE)"
    STATUS = "pods/status"
    BINDING = "pods/binding"


class Phase(Enum):
    """Where a rule's messages stand in a denial (`validation.validate_pod`, and the policies' one validation): the
    phases in this order, the rules of a phase by their `rank`."""

    VALUE = "the values (`fractions.resolve`): on CREATE the mutating webhook denies them alone, before the rest"
    AUTHORSHIP = "who may write what"
    OUTPUT = "the webhook's own output, only when no value or authorship rule denies (else it repeats the cause)"
    FRACTIONAL = "the rest, on a pod with a fraction"
    OWN = "a request of its own (pods/status, a Binding), in a policy of its own"


@dataclass(frozen=True)
class Rule:
    name: str  # a CEL identifier: the policy's variable holding its messages
    summary: str
    scope: Scope
    phase: Phase
    rank: int  # its place in its phase: the one place the order of the rules is written
    webhook: tuple[Callable[..., Any], ...]  # the functions the webhook evaluates it with
    cel: str | None = None  # a CEL list of denial messages, empty when the request keeps the rule
    webhook_only: str = ""  # why CEL does not carry it (or only part of it: then cel is set too)

    def __post_init__(self) -> None:
        if self.cel is None and not self.webhook_only:
            raise ValueError(f"rule {self.name}: give its CEL, or say why it stays in the webhook")
