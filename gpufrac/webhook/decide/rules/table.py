"""The rule table: every rule the validating webhook applies, and where it runs (docs/architecture.md, "Which rule
runs where").

Pure. Each `Rule` names the Python function(s) the webhook evaluates it with and either carries the same rule in CEL,
as a list of denial messages the API server computes from the object (the webhook's `list[Violation]`, in words
built from the same constants), or says why it stays in the webhook. `policies.py` turns the CEL into
ValidatingAdmissionPolicies; tests/webhook/test_rule_table.py fails when a webhook rule is in no row, and
tests/chart/test_policies.py when the chart's policies are not what the table generates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from gpufrac.core import annotations as ann
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide import validation as va
from gpufrac.webhook.decide.cel import when
from gpufrac.webhook.decide.rules.authorship import (
    cel_binding,
    cel_devices_on_create,
    cel_immutable,
    cel_status,
    cel_webhook_output,
)
from gpufrac.webhook.decide.rules.boundaries import (
    cel_boundaries,
    cel_injection,
    cel_kai_older_sharing_mode,
)
from gpufrac.webhook.decide.rules.pod_values import (
    cel_container_limit_needs_memory_limit,
    cel_container_values,
    cel_devices_follow_the_request,
    cel_fraction_or_memory,
    cel_keys_name_the_target,
    cel_malformed,
    cel_mode_and_devices_need_a_fraction,
    cel_name_fits_the_keys,
    cel_num_devices_need_a_fraction,
    cel_one_compute_mode,
    cel_one_fraction_container,
    cel_portion_limit_names_the_first_container,
    cel_portion_without_absolute_memory,
    cel_request_within_limit,
    cel_target,
    cel_translation_agrees,
    cel_unknown_container,
)
from gpufrac.webhook.decide.rules.values import (
    fraction_problem,
    memory_limit_problem,
    memory_mib_problem,
    mode_value_problem,
    num_devices_problem,
    portion_limit_problem,
    shorthand_rule,
)


class Scope(Enum):
    """The requests a rule judges: a pod's CREATE and UPDATE (CREATE/UPDATE: one of them), pods/status, pods/binding."""

    POD = "pods"
    CREATE = "pods (CREATE)"
    UPDATE = "pods (UPDATE)"
    STATUS = "pods/status"
    BINDING = "pods/binding"


@dataclass(frozen=True)
class Rule:
    name: str  # a CEL identifier: the policy's variable holding its messages, and the validation's name
    summary: str
    scope: Scope
    webhook: tuple[Callable[..., Any], ...]  # the functions the webhook evaluates it with
    cel: str | None = None  # a CEL list of denial messages, empty when the request keeps the rule
    webhook_only: str = ""  # why CEL does not carry it (or only part of it: then cel is set too)

    def __post_init__(self) -> None:
        if self.cel is None and not self.webhook_only:
            raise ValueError(f"rule {self.name}: give its CEL, or say why it stays in the webhook")
_DECIMAL_DIGITS = ("a number in scientific notation whose plain form has more than 5 digits after the point "
                   "(123456e-6): CEL has no exact decimals")
_NODE = "needs the node's facts (the MPS directories as the node resolves host paths)"
RULES: tuple[Rule, ...] = (
    Rule("malformedKeys", "keys under gpufrac's prefixes follow the grammar", Scope.POD,
         (fr.read_container_keys,), cel_malformed()),
    Rule("unknownContainers", "a per-container key names a container of the pod", Scope.POD,
         (fr.read_container_keys,), cel_unknown_container()),
    Rule("targetContainer", "gpu-fraction-container-name names a container", Scope.POD, (fr.read_target,),
         cel_target()),
    Rule("fraction", "gpu-fraction is a decimal in (0, 1) KAI can bind", Scope.POD, (fr.read_fraction,),
         shorthand_rule(ann.FRACTION, fraction_problem),
         "partly: a number in (0, 1) that binary64 reads as 0 or 1 is denied with the range message, not with "
         "\"as KAI's scheduler reads it\""),
    Rule("memory", "gpu-memory is a whole number of MiB", Scope.POD, (fr.read_memory_mib,),
         shorthand_rule(ann.MEMORY, memory_mib_problem)),
    Rule("fractionLimit", "gpu-fraction.limit lies strictly between gpu-fraction and 1, at most 5 digits",
         Scope.POD, (fr.read_portion_limit,), shorthand_rule(ann.FRACTION_LIMIT, portion_limit_problem),
         "partly: " + _DECIMAL_DIGITS),
    Rule("memoryLimit", "gpu-memory.limit has a unit and is at least gpu-memory", Scope.POD,
         (fr.read_memory_limit,), shorthand_rule(ann.MEMORY_LIMIT, memory_limit_problem)),
    Rule("numDevicesValue", "gpu-fraction-num-devices is 1 to 64", Scope.POD, (fr.read_num_devices,),
         shorthand_rule(ann.NUM_DEVICES, num_devices_problem)),
    Rule("modeShorthand", "the pod-level compute mode is a mode (on a pod with a fraction)", Scope.POD,
         (fr.read_mode,), when("size(variables.fractional) > 0", shorthand_rule(ann.COMPUTE_MODE, mode_value_problem)),
         "partly: on a pod without a fraction the webhook judges the value only beside another wrong value (a lone "
         "mode is allowed with a warning, `fractions.lone_compute_mode`)"),
    Rule("fractionOrMemory", "gpu-fraction and gpu-memory are not both set", Scope.POD, (fr.rule_fraction_or_memory,),
         cel_fraction_or_memory()),
    Rule("portionWithoutMemory", "a portion pod carries no absolute memory keys on CREATE", Scope.CREATE,
         (fr.rule_portion_without_absolute_memory,), cel_portion_without_absolute_memory()),
    Rule("containerLimitNeedsMemoryLimit", "with gpu-memory alone, no per-container limit", Scope.POD,
         (fr.rule_container_limit_needs_memory_limit,), cel_container_limit_needs_memory_limit()),
    Rule("translationAgrees", "a per-container key says what its shorthand says", Scope.POD,
         (fr.rule_translation_agrees, fr.translate), cel_translation_agrees()),
    Rule("numDevicesNeedFraction", "gpu-fraction-num-devices needs a fraction", Scope.POD,
         (fr.rule_num_devices_need_a_fraction,), cel_num_devices_need_a_fraction()),
    Rule("keysNameTheTarget", "with shorthands, per-container keys name the shorthands' container", Scope.POD,
         (fr.rule_keys_name_the_target,), cel_keys_name_the_target()),
    Rule("containerValues", "per-container memory, mode, devices, compute portion and portion-limit values",
         Scope.POD, (fr.read_container_request, fr.read_amount, fr.read_devices, fr.read_compute_portion),
         cel_container_values(),
         "partly: " + _DECIMAL_DIGITS),
    Rule("requestWithinLimit", "request <= limit, in exact bytes", Scope.POD, (fr.rule_request_within_limit,),
         cel_request_within_limit()),
    Rule("modeAndDevicesNeedFraction", "a mode or devices only for a container with a fraction", Scope.POD,
         (fr.rule_mode_and_devices_need_a_fraction,), cel_mode_and_devices_need_a_fraction()),
    Rule("portionLimitNamesFirstContainer", "a portion limit on another container than the first names it",
         Scope.POD, (fr.rule_portion_limit_names_the_first_container,),
         cel_portion_limit_names_the_first_container()),
    Rule("oneFractionContainer", "one fraction container per pod (KAI's binder)", Scope.POD,
         (fr.rule_one_fraction_container,), cel_one_fraction_container()),
    Rule("oneComputeMode", "the fractions of a pod share one compute mode", Scope.POD,
         (fr.rule_one_compute_mode,), cel_one_compute_mode()),
    Rule("devicesFollowRequest", "devices come with memory, one per requested device", Scope.POD,
         (fr.rule_devices_follow_the_request,), cel_devices_follow_the_request()),
    Rule("nameFitsKeys", "a fraction container's name fits in every key", Scope.POD,
         (fr.rule_name_fits_the_keys,), cel_name_fits_the_keys()),
    Rule("devicesOnCreate", "gpus.devices is written by the scheduler only, at bind", Scope.CREATE,
         (va._authorship, va._authorship_on_create), cel_devices_on_create()),
    Rule("immutable", "fraction annotations and the label do not change after CREATE (but the scheduler's bind)",
         Scope.UPDATE, (va._authorship, va._authorship_on_update), cel_immutable(),
         "partly: what the scheduler itself may add at bind (its own keys, for a portion container) needs the old "
         "pod's fractions; the policies leave the scheduler's updates to the webhook"),
    Rule("webhookOutput", "the canonical annotations and the label are exactly what gpufrac derives", Scope.POD,
         (va._webhook_output,), cel_webhook_output()),
    Rule("kaiOlderSharingMode", "no pod KAI's older GPU-sharing admission mutated", Scope.CREATE,
         (va._kai_older_sharing_mode,), cel_kai_older_sharing_mode()),
    Rule("injection", "each fractional container carries the env and mounts gpufrac injects", Scope.CREATE,
         (va._injection,), cel_injection(),
         "partly: with hostPath delivery (mps.delivery) the policies leave it to the webhook"),
    Rule("boundaries", "no privileged container, host namespaces, SYS_ADMIN, whole GPUs, limit env or foreign MPS "
                       "volumes beside a fraction", Scope.POD,
         (va._boundaries, va._boundary_host_namespaces, va._boundary_foreign_volumes, va._foreign_mps_volume,
          va._boundary_whole_gpus, va._boundary_mps_mounts, va._boundary_privileged, va._boundary_capabilities,
          va._boundary_limit_env, va._limit_env_outside_fractions), cel_boundaries(),
         "partly: " + _NODE + "; a hostPath written other than plainly (`..`, `//`, `/./`) and hostPath delivery "
         "stay with the webhook"),
    Rule("status", "pods/status changes no fraction annotation and not the label", Scope.STATUS,
         (va.validate_status,), cel_status()),
    Rule("binding", "a Binding carries no fraction annotation", Scope.BINDING, (va.validate_binding,), cel_binding()),
)
