"""What a rule is: the requests it judges, where its messages go in a denial, the webhook's Python that evaluates
it, and the CEL that carries it in the ValidatingAdmissionPolicies (or why none does).

Pure. Each rule is one module of `rules/catalog/`, holding its `RULE`; `table` gathers them, and the webhook runs
them phase by phase (`table.run`): a rule's check gets its phase's context (`rules.context`) and returns its
violations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from gpufrac.webhook.decide.errors import Violation

# A rule's Python: given its phase's context (`rules.context`: `Values`, `PodReview` or `OwnRequest`), what it denies.
Check = Callable[[Any], list[Violation]]


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

    VALUE = "the values (`resolve`): on CREATE the mutating webhook denies them alone, before the rest"
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
    check: Check | None  # the webhook's Python, given its phase's context (None: `reads` finds its violations)
    cel: str | None = None  # a CEL list of denial messages, empty when the request keeps the rule
    webhook_only: str = ""  # why CEL does not carry it (or only part of it: then cel is set too)
    # The reader of `fractions.read` (VALUE only) that finds this rule's violations while it reads the values the
    # checks then judge; rules sharing a reader have its violations once, where the first of them stands.
    reads: Callable[..., Any] | None = None
    # Judged one fraction at a time (VALUE only): the rules that are run fraction by fraction together, where the
    # first of them stands, so a denial lists each fraction's messages together (the policies' CEL lists them rule
    # by rule).
    by_fraction: bool = False

    def __post_init__(self) -> None:
        if self.cel is None and not self.webhook_only:
            raise ValueError(f"rule {self.name}: give its CEL, or say why it stays in the webhook")
        if self.check is None and self.reads is None:
            raise ValueError(f"rule {self.name}: give its check, or the reader that finds its violations")
        if (self.reads is not None or self.by_fraction) and self.phase is not Phase.VALUE:
            raise ValueError(f"rule {self.name}: only a value rule is found while reading or judged by fraction")
