"""The MutatingAdmissionPolicy tried for docs/admission-policies.md: the webhook's CREATE translation of the seed pods
as one ApplyConfiguration, reading the annotations with the same CEL variables the ValidatingAdmissionPolicies use
(gpufrac/webhook/decide/rules/). Not shipped: tests/e2e/test_mutating_policy_trial.py compares what it makes of every
example with what the webhook makes, and the report says where they differ.

What it carries: the translated per-container keys, the canonical annotations, the fractional label, each fractional
container's env (fieldRefs) and MPS mounts, `void` for the other containers, the CSI volume. What it does not try:
the required node affinity (`requireEnforcingNode`: an atomic list, rebuilt term by term), the warnings the webhook
gives when it replaces a user's value (a MutatingAdmissionPolicy has none), denials (it cannot deny; the
ValidatingAdmissionPolicies do), hostPath delivery, the bind-time UPDATE and ephemeral containers.
"""

from __future__ import annotations

from typing import Any

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import CanonicalField, Field
from gpufrac.core.contract import FRACTIONAL_LABEL, FRACTIONAL_VALUE, NO_GPU, LimitEnv
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.cel import lit
from gpufrac.webhook.decide.mutation import injected_env, injected_mounts, injected_volumes, volume_name
from gpufrac.webhook.decide.policy import Policy
from gpufrac.webhook.decide.rules import MODES, VARIABLES

API_VERSION = "admissionregistration.k8s.io/v1"
NAME = "gpufrac-translate-trial"


def _at(variable: str, c: str) -> str:
    return f"variables.{variable}[variables.names.indexOf({c})]"


def _annotations() -> str:
    """The translated keys (KAI's strings) and the canonical ones, as one CEL map with optional entries."""
    t = "string(variables.target)"
    nv, kai, ours = lit(ann.NVIDIA_PREFIX), lit(ann.KAI_PREFIX), lit(ann.CANONICAL_PREFIX)
    entries = [
        f"?({nv} + {t} + {lit('.' + Field.MEMORY_REQUEST)}): variables.memoryOk ? "
        f"optional.of(string(variables.translatedRequest)) : optional.none()",
        f"?({nv} + {t} + {lit('.' + Field.MEMORY_LIMIT)}): variables.memoryLimitOk ? "
        f"optional.of(string(variables.anns[{lit(ann.MEMORY_LIMIT)}])) : optional.none()",
        f"?({kai} + {t} + {lit('.' + fr.PORTION_LIMIT)}): variables.fractionLimitOk ? "
        f"optional.of(string(variables.anns[{lit(ann.FRACTION_LIMIT)}])) : optional.none()",
        f"?({nv} + {t} + {lit('.' + Field.COMPUTE_MODE)}): variables.modeOk ? "
        f"optional.of(string(variables.anns[{lit(ann.COMPUTE_MODE)}])) : optional.none()",
    ]
    # One fraction container (KAI's binder; allowMultipleFractionContainers is not tried): the first.
    f = "string(variables.fractional[0])"
    memory = f"({_at('requestText', f)} != '' || {_at('limitText', f)} != '')"
    entries += [
        f"({ours} + {f} + {lit('.' + CanonicalField.COMPUTE_MODE)}): string({_at('modeOf', f)})",
        f"?({ours} + {f} + {lit('.' + CanonicalField.REQUEST_MIB)}): {memory} ? "
        f"optional.of(string({_at('requestMib', f)})) : optional.none()",
        f"?({ours} + {f} + {lit('.' + CanonicalField.LIMIT_MIB)}): {memory} ? "
        f"optional.of(string({_at('limitMib', f)})) : optional.none()",
        f"?({ours} + {f} + {lit('.' + CanonicalField.MPS_PINNED_MEM_LIMIT)}): {memory} ? optional.of(string("
        f"{list(range(fr.MAX_DEVICES))}.filter(i, i < variables.numDevices)"
        f".map(i, string(i) + '=' + string({_at('limitMib', f)}) + 'M').join(','))) : optional.none()",
    ]
    return "{" + ", ".join(entries) + "}"


def _env_entry(entry: dict[str, Any], container: str, containers: str) -> str:
    kind = f"Object.spec.{containers}.env"
    if "value" in entry:
        return f"{kind}{{name: {lit(entry['name'])}, value: {lit(entry['value'])}}}"
    before, _, after = entry["valueFrom"]["fieldRef"]["fieldPath"].partition("<c>")
    field_path = f"{lit(before)} + {container} + {lit(after)}"
    return (f"{kind}{{name: {lit(entry['name'])}, valueFrom: {kind}.valueFrom{{fieldRef: "
            f"{kind}.valueFrom.fieldRef{{apiVersion: 'v1', fieldPath: {field_path}}}}}}}")


def _mode_branches(policy: Policy, build: Any) -> str:
    """`build(mode)` for the fraction's mode, as a CEL conditional over the modes."""
    mode = _at("modeOf", "variables.fractional[0]")
    first, *rest = MODES
    out = build(first)
    for other in rest:
        out = f"({mode} == {lit(other)} ? {build(other)} : {out})"
    return out


def _container(policy: Policy, c: str, kind: str) -> str:
    """The apply configuration of one container `c` (CEL) of list `kind` (containers, initContainers)."""
    def fractional(mode: str) -> str:
        env = ", ".join(_env_entry(e, c, kind) for e in injected_env("<c>", mode, policy))  # type: ignore[arg-type]
        mounts = ", ".join(
            f"Object.spec.{kind}.volumeMounts{{name: {lit(m['name'])}, mountPath: {lit(m['mountPath'])}"
            + (f", subPath: {lit(m['subPath'])}" if "subPath" in m else "") + "}"
            for m in injected_mounts(mode, policy))  # type: ignore[arg-type]
        return f"Object.spec.{kind}{{name: {c}, env: [{env}], volumeMounts: [{mounts}]}}"

    hide = (f"Object.spec.{kind}{{name: {c}, env: [Object.spec.{kind}.env{{name: "
            f"{lit(LimitEnv.VISIBLE_DEVICES)}, value: {lit(NO_GPU)}}}]}}")
    return f"({c} in variables.fractional ? {_mode_branches(policy, fractional)} : {hide})"


def _volumes(policy: Policy) -> str:
    def volume(mode: str) -> str:
        (v,) = injected_volumes(mode, policy)  # type: ignore[arg-type]
        attrs = ", ".join(f"{lit(k)}: {lit(val)}" for k, val in v["csi"]["volumeAttributes"].items())
        name = lit(volume_name(mode))  # type: ignore[arg-type]
        return (f"[Object.spec.volumes{{name: {name}, csi: Object.spec.volumes.csi{{driver: "
                f"{lit(v['csi']['driver'])}, volumeAttributes: {{{attrs}}}}}}}]")
    return _mode_branches(policy, volume)


def mutation_expression(policy: Policy) -> str:
    containers = (f"object.spec.containers.map(c, c.name).map(c, {_container(policy, 'c', 'containers')})")
    init = (f"object.spec.?initContainers.orValue([]).map(c, c.name)"
            f".map(c, {_container(policy, 'c', 'initContainers')})")
    return (f"size(variables.fractional) == 0 ? Object{{}} : Object{{metadata: Object.metadata{{labels: "
            f"{{{lit(FRACTIONAL_LABEL)}: {lit(FRACTIONAL_VALUE)}}}, annotations: {_annotations()}}}, "
            f"spec: Object.spec{{containers: {containers}, initContainers: {init}, volumes: {_volumes(policy)}}}}}")


def objects(policy: Policy) -> list[dict[str, Any]]:
    variables = [{"name": n, "expression": e} for n, e in VARIABLES if n != "isScheduler"]
    policy_obj = {
        "apiVersion": API_VERSION, "kind": "MutatingAdmissionPolicy", "metadata": {"name": NAME},
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "IfNeeded",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                    "operations": ["CREATE"], "resources": ["pods"]}]},
            "matchConditions": [{"name": "has-fraction-keys", "expression": (
                f"object.metadata.?annotations.orValue({{}}).exists(k, k in "
                f"[{', '.join(lit(k) for k in ann.SHORTHAND_KEYS)}] || k.startsWith({lit(ann.NVIDIA_PREFIX)}) || "
                f"k.startsWith({lit(ann.KAI_PREFIX)}))")}],
            "variables": variables,
            "mutations": [{"patchType": "ApplyConfiguration",
                           "applyConfiguration": {"expression": mutation_expression(policy)}}],
        },
    }
    binding = {"apiVersion": API_VERSION, "kind": "MutatingAdmissionPolicyBinding", "metadata": {"name": NAME},
               "spec": {"policyName": NAME}}
    return [policy_obj, binding]
