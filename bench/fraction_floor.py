"""What a fractional CREATE costs with gpufrac's additions made without gpufrac (issue 47): measured with nothing of
gpufrac's installed, right after nothing's phases, beside gpufrac's defaults in the same run.

- STORED: the client sends each seed pod already as gpufrac's admission leaves it (its label, canonical annotations,
  node affinity, env `fieldRef`s, MPS mounts and CSI volume, captured by a dry run under the defaults). No admission
  runs: this is what validating and storing the larger pod costs by itself.
- POLICY: the user's pods, and one MutatingAdmissionPolicy that writes those same additions as a constant JSON patch
  (no CEL that computes anything, no webhook, `reinvocationPolicy: Never`). The least a MutatingAdmissionPolicy pays to
  write them: the policy's activation, the patch, the object converted and decoded again, and the
  admission chain run a second time because the object changed (k8s.io/apiserver `admission/reinvocation.go`).

- WEBHOOK: the user's pods, and one mutating webhook that answers each with the same additions as a constant JSON
  patch (bench/constant_app.py: no decision, nothing built per review; no matchConditions, `reinvocationPolicy:
  Never`). The least any webhook pays to write them: the review encoded, the HTTPS round trip, the patch applied,
  the object decoded again, and the chain's second pass.

Each also with the metadata alone (METADATA: the label, the canonical annotations, the node affinity): what a pod
would carry were its env and mounts delivered at container creation instead of written into its spec. Fractional
CREATEs only: a plain pod gets nothing from gpufrac."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jsonpatch

from e2e.toolkit.wait import wait_until

STORED = "gpufrac's pod, sent"  # the setups' names in the report
POLICY = "a constant MutatingAdmissionPolicy"
WEBHOOK = "a constant webhook"
METADATA = "metadata only"  # what a pod would carry were the env and mounts delivered at container creation
STORED_METADATA = f"{STORED}, {METADATA}"
POLICY_METADATA = f"{POLICY}, {METADATA}"
WEBHOOK_METADATA = f"{WEBHOOK}, {METADATA}"
SETUPS = (STORED, POLICY, WEBHOOK, STORED_METADATA, POLICY_METADATA, WEBHOOK_METADATA)
# The additions' variants (bench.constant_app's URL path), each sent, written by the policy, written by the webhook.
VARIANTS = {"whole": (STORED, POLICY, WEBHOOK), "metadata": (STORED_METADATA, POLICY_METADATA, WEBHOOK_METADATA)}
_METADATA_PATHS = ("/metadata/", "/spec/affinity")
NAME = "gpufrac-bench-fraction-floor"
_SERVICE_ACCOUNT_VOLUME = "kube-api-access-"  # ServiceAccount admission's, with a random suffix: never copied
_LISTS = ("volumes", "volumeMounts")  # lists gpufrac appends to, where the API server may have put entries first


@dataclass(frozen=True)
class Shape:
    """One seed pod's fraction annotations, and what gpufrac's admission adds to a pod that carries them: a JSON
    patch from the stored pod with nothing installed to the stored pod under the defaults (both dry runs), the
    ServiceAccount's token volume left out of both, list additions made appends."""

    annotations: Mapping[str, str]
    patch: list[dict[str, Any]]

    def metadata_only(self) -> Shape:
        """The additions a pod would keep were its env and mounts delivered at container creation (by the node, as
        NRI or CDI can): the label, the canonical annotations, the node affinity."""
        return Shape(self.annotations, [op for op in self.patch if op["path"].startswith(_METADATA_PATHS)])

    def stored(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        """`pod` (the user's) as gpufrac's admission would leave it, before the API server's own defaults."""
        out = copy.deepcopy(dict(pod))
        spec = out["spec"]
        containers = [*spec.get("containers", []), *spec.get("initContainers", [])]
        made = [(spec, "volumes")] + [(c, "volumeMounts") for c in containers]
        for holder, key in made:
            holder.setdefault(key, [])
        out = jsonpatch.apply_patch(out, self.patch)
        for holder in [out["spec"], *out["spec"].get("containers", []), *out["spec"].get("initContainers", [])]:
            for key in _LISTS:
                if holder.get(key) == []:
                    del holder[key]
        return out


def _comparable(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A stored pod without what differs between two stores of one request: the ServiceAccount's token volume (its
    name is random), the name (one per request), the server's metadata and the status."""
    out = copy.deepcopy(dict(pod))
    for key in ("name", "uid", "creationTimestamp", "managedFields", "resourceVersion", "generation"):
        out["metadata"].pop(key, None)
    out.pop("status", None)
    spec = out["spec"]
    spec["volumes"] = [v for v in spec.get("volumes", []) if not v["name"].startswith(_SERVICE_ACCOUNT_VOLUME)]
    for c in [*spec.get("containers", []), *spec.get("initContainers", [])]:
        c["volumeMounts"] = [m for m in c.get("volumeMounts", [])
                             if not m["name"].startswith(_SERVICE_ACCOUNT_VOLUME)]
    return out


def _appending(patch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An `add` at an index of a list the API server may already hold entries of becomes an append."""
    out = []
    for op in patch:
        parts = op["path"].split("/")
        if op["op"] == "add" and parts[-1].isdigit() and parts[-2] in _LISTS:
            op = {**op, "path": "/".join([*parts[:-1], "-"])}
        out.append(op)
    return out


def shape(annotations: Mapping[str, str], plain: Mapping[str, Any], mutated: Mapping[str, Any]) -> Shape:
    """`plain`, `mutated`: the same pod as the API server would store it with nothing installed, and under gpufrac's
    defaults (dry runs)."""
    patch = jsonpatch.make_patch(_comparable(plain), _comparable(mutated)).patch
    if not patch:
        raise RuntimeError("gpufrac's defaults added nothing to a fractional pod's dry run")
    return Shape(dict(annotations), _appending(patch))


def _cel(value: Any) -> str:
    """A JSON value as a CEL literal; `dyn` lets one map or list hold values of different types."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: dyn({_cel(v)})" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(f"dyn({_cel(v)})" for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def _matches(annotations: Mapping[str, str]) -> str:
    """CEL: the object carries exactly these annotations' values (all of them: a seed pod tells itself apart)."""
    return " && ".join(f"object.metadata.?annotations[?{json.dumps(k)}].orValue('') == {json.dumps(v)}"
                       for k, v in sorted(annotations.items()))


def _mutation(s: Shape) -> dict[str, Any]:
    ops = ", ".join("JSONPatch{" + f"op: {json.dumps(op['op'])}, path: {json.dumps(op['path'])}"
                    + (f", from: {json.dumps(op['from'])}" if "from" in op else "")
                    + (f", value: {_cel(op['value'])}" if "value" in op else "") + "}" for op in s.patch)
    return {"patchType": "JSONPatch", "jsonPatch": {"expression": f"{_matches(s.annotations)} ? [{ops}] : []"}}


def policy_objects(shapes: list[Shape], selector: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The MutatingAdmissionPolicy (one constant patch per seed shape, on pods CREATE whose labels match
    `selector`) and its Binding."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": NAME},
        "spec": {"failurePolicy": "Fail", "reinvocationPolicy": "Never",
                 "matchConstraints": {
                     "objectSelector": {"matchLabels": dict(selector)},
                     "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                        "resources": ["pods"]}]},
                 "mutations": [_mutation(s) for s in shapes]},
    }
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding",
               "metadata": {"name": NAME}, "spec": {"policyName": NAME}}
    return policy, binding


def install_policy(admission_api: Any, shapes: list[Shape], selector: Mapping[str, str],
                   applied: Callable[[], bool], timeout: float = 30) -> None:
    """The policy created, and waited for until `applied` (a dry run comes back as gpufrac stores it): the API
    server loads it by an informer."""
    policy, binding = policy_objects(shapes, selector)
    admission_api.create_mutating_admission_policy(policy)
    admission_api.create_mutating_admission_policy_binding(binding)
    wait_until(applied, timeout, "the constant MutatingAdmissionPolicy to apply", interval=0.2)


def remove_policy(admission_api: Any, gone: Callable[[], bool], timeout: float = 30) -> None:
    admission_api.delete_mutating_admission_policy_binding(NAME)
    admission_api.delete_mutating_admission_policy(NAME)
    wait_until(gone, timeout, "the constant MutatingAdmissionPolicy to be gone", interval=0.2)


def variants(whole: list[Shape]) -> dict[str, list[Shape]]:
    """VARIANTS' shapes, in its order: all of gpufrac's additions, and the metadata alone."""
    return dict(zip(VARIANTS, (whole, [s.metadata_only() for s in whole]), strict=True))


def answers(variants: Mapping[str, list[Shape]]) -> str:
    """bench.constant_app's answers file: each variant's shapes, their annotations and patch."""
    return json.dumps({variant: [{"annotations": dict(s.annotations), "patch": s.patch} for s in shapes]
                       for variant, shapes in variants.items()})


def webhook_configuration(url: str, ca_bundle: str, selector: Mapping[str, str]) -> dict[str, Any]:
    """One mutating webhook at `url` (bench.constant_app's `/mutate/<variant>`) on pods CREATE whose labels match
    `selector`: no matchConditions, not called again, failing closed (a pod it did not answer is an error)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": NAME},
        "webhooks": [{"name": "constant.bench.gpufrac.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                      "failurePolicy": "Fail", "reinvocationPolicy": "Never", "timeoutSeconds": 5,
                      "clientConfig": {"url": url, "caBundle": ca_bundle},
                      "objectSelector": {"matchLabels": dict(selector)},
                      "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                 "resources": ["pods"], "scope": "Namespaced"}]}],
    }


def install_webhook(admission_api: Any, configuration: Mapping[str, Any], applied: Callable[[], bool],
                    timeout: float = 30) -> None:
    """The constant webhook registered, and waited for until `applied` (the API server loads it by an informer)."""
    admission_api.create_mutating_webhook_configuration(dict(configuration))
    wait_until(applied, timeout, "the constant webhook to apply", interval=0.2)


def remove_webhook(admission_api: Any, gone: Callable[[], bool], timeout: float = 30) -> None:
    admission_api.delete_mutating_webhook_configuration(NAME)
    wait_until(gone, timeout, "the constant webhook to be gone", interval=0.2)


def same_but_token(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Two stored pods equal but for what differs between two stores of one request (_comparable)."""
    return _comparable(a) == _comparable(b)
