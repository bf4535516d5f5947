"""The two decisions, from a checked ReviewRequest to an outcome. Pure: the HTTP layer only moves bytes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpufrac.webhook.decide import workloads
from gpufrac.webhook.decide.default_mode import with_default_mode
from gpufrac.webhook.decide.errors import Violation
from gpufrac.webhook.decide.mutation import Mutation, mutate_bind, mutate_create, mutate_ephemeral
from gpufrac.webhook.decide.patch import diff
from gpufrac.webhook.decide.policy import Policy
from gpufrac.webhook.decide.resolve import resolve
from gpufrac.webhook.decide.review import ReviewRequest
from gpufrac.webhook.decide.validation import validate_binding, validate_pod, validate_status


@dataclass
class Outcome:
    violations: list[Violation] = field(default_factory=list)
    patch: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def allowed(self) -> bool:
        return not self.violations

    @property
    def message(self) -> str:
        return "; ".join(str(v) for v in self.violations)


def _patch(before: dict[str, Any], mutation: Mutation) -> Outcome:
    return Outcome(patch=diff(before, mutation.obj), warnings=mutation.warnings)


def mutate(request: ReviewRequest, policy: Policy) -> Outcome:
    """The mutating webhook. It denies what it cannot turn into limits, so the user hears why at once."""
    obj = request.obj
    if obj is None or request.resource != "pods" or request.operation not in ("CREATE", "UPDATE"):
        return Outcome()
    if request.sub_resource == "ephemeralcontainers":
        fractions, _ = resolve(obj, bound=True)
        return _patch(obj, mutate_ephemeral(obj, fractions))
    if request.sub_resource:
        return Outcome()
    if request.operation == "CREATE":
        defaulted = with_default_mode(obj, policy.default_mode)  # as if the user wrote it; the patch carries it
        fractions, violations = resolve(defaulted, bound=False,
                                        allow_multiple=policy.allow_multiple_fraction_containers)
        if violations:
            return Outcome(violations=violations)
        mutation = mutate_create(defaulted, fractions, policy)
        # Every validating rule, on the pod as it will be stored: where this webhook fails closed (and is called
        # again after a later webhook changes the pod), neither the validating webhook nor the policies need to
        # look at a pod's CREATE (docs/admission-policies.md, "What runs on each request").
        violations = validate_pod(mutation.obj, None, request.user, policy)
        if violations:
            return Outcome(violations=violations)
        outcome = _patch(obj, mutation)
        outcome.warnings += fractions.warnings
        return outcome
    # UPDATE: only the scheduler's bind-time values are turned into canonical annotations. Anyone else's change to
    # fraction annotations is left for the validating webhook to deny, not quietly repaired.
    if not policy.is_scheduler(request.user):
        return Outcome()
    # The scheduler's UPDATE is judged here, whole, on the pod as it will be stored, as a CREATE is: where this
    # webhook fails closed the validating webhook is not called on it (issue 47: one call per bind, not two).
    old = request.old_obj or {}
    fractions, violations = resolve(obj, bound=True, allow_multiple=policy.allow_multiple_fraction_containers)
    if violations:  # with who changed what as well as why it is wrong, as the validating webhook says it
        return Outcome(violations=validate_pod(obj, old, request.user, policy) or violations)
    mutation = mutate_bind(obj, fractions)
    violations = validate_pod(mutation.obj, old, request.user, policy)
    if violations:
        return Outcome(violations=violations)
    return _patch(obj, mutation)


def validate(request: ReviewRequest, policy: Policy) -> Outcome:
    obj = request.obj
    if obj is None or request.operation not in ("CREATE", "UPDATE"):
        return Outcome()
    workload = workloads.BY_RESOURCE.get(request.resource)
    if workload is not None:
        if request.sub_resource:
            return Outcome()  # status and scale do not change the template
        old = request.old_obj if request.operation == "UPDATE" else None
        return Outcome(violations=workloads.validate_workload(obj, old, workload, policy))
    if request.resource != "pods":
        return Outcome()
    if request.sub_resource == "binding":
        return Outcome(violations=validate_binding(obj))
    if request.sub_resource == "status":
        if request.operation != "UPDATE" or request.old_obj is None:
            return Outcome()  # status is only ever updated; there is nothing to compare a create with
        return Outcome(violations=validate_status(obj, request.old_obj))
    if request.sub_resource not in ("", "ephemeralcontainers"):
        return Outcome()
    old = request.old_obj if request.operation == "UPDATE" else None
    if request.operation == "UPDATE" and old is None:
        old = {}
    return Outcome(violations=validate_pod(obj, old, request.user, policy))
