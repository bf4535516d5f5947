"""The floor under any exact gate (issue 34): what the API server spends on a `matchConditions` gate before any
expression of gpufrac's runs. Nothing of gpufrac's is installed; instead one mutating webhook on pods' CREATE and one
bound ValidatingAdmissionPolicy on pods/status UPDATE, each with a single condition, `false`: neither is ever called
or evaluated further, so a plain pod's CREATE and status write each meet one gate that reads nothing. Beside
gpufrac's gates in the same run (bench/admission_tax.py), the difference is what gpufrac's expressions add; the floor
itself is Kubernetes' (k8s.io/apiserver's `newActivation` converts the object, the old object and the request before
any condition runs), and a gate that reads annotations cannot go below it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from e2e.toolkit.wait import wait_until

FLOOR = "an empty gate"  # the setup's name in the report
NAME = "gpufrac-bench-floor"
NEVER = [{"name": "never", "expression": "false"}]

WEBHOOK: dict[str, Any] = {
    "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
    "metadata": {"name": NAME},
    "webhooks": [{
        "name": "floor.bench.gpufrac.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
        "failurePolicy": "Ignore", "matchPolicy": "Equivalent", "timeoutSeconds": 1,
        "clientConfig": {"url": "https://127.0.0.1:1/never"},  # never called: its one condition is false
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                   "scope": "Namespaced"}],
        "matchConditions": NEVER}],
}
POLICY: dict[str, Any] = {
    "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
    "metadata": {"name": NAME},
    "spec": {"failurePolicy": "Fail",
             "matchConstraints": {"resourceRules": [{"operations": ["UPDATE"], "apiGroups": [""],
                                                     "apiVersions": ["v1"], "resources": ["pods/status"]}]},
             "matchConditions": NEVER,
             "validations": [{"expression": "true"}]},
}
BINDING: dict[str, Any] = {
    "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
    "metadata": {"name": NAME},
    "spec": {"policyName": NAME, "validationActions": ["Deny"]},
}


def _counted(gates: Callable[[], tuple[float, int]], send: Callable[[], bytes]) -> Callable[[], bool]:
    """A probe for wait_until: one request sent, True once the API server has timed a gate for it."""
    def probe() -> bool:
        before = gates()[1]
        send()
        return gates()[1] > before
    return probe


def install(admission_api: Any, gates: Callable[[], tuple[float, int]], plain_create: Callable[[], bytes],
            status_write: Callable[[], bytes], timeout: float = 30) -> None:
    """The two empty gates created, and waited for: the API server picks them up by its informers, so each is
    taken to apply once a request of its kind is timed by the gate metric (`gates`: its running (sum, count))."""
    admission_api.create_mutating_webhook_configuration(WEBHOOK)
    admission_api.create_validating_admission_policy(POLICY)
    admission_api.create_validating_admission_policy_binding(BINDING)
    wait_until(_counted(gates, plain_create), timeout, "the empty webhook gate to apply", interval=0.2)
    wait_until(_counted(gates, status_write), timeout, "the empty policy gate to apply", interval=0.2)


def remove(admission_api: Any, gates: Callable[[], tuple[float, int]], plain_create: Callable[[], bytes],
           status_write: Callable[[], bytes], timeout: float = 30) -> None:
    """The two empty gates deleted, and waited for until neither is timed (with nothing else installed, no gate is),
    so that the next setup's requests meet only its own."""
    admission_api.delete_validating_admission_policy_binding(NAME)
    admission_api.delete_validating_admission_policy(NAME)
    admission_api.delete_mutating_webhook_configuration(NAME)
    for send, what in ((plain_create, "webhook"), (status_write, "policy")):
        counted = _counted(gates, send)
        wait_until(lambda counted=counted: not counted(), timeout, f"the empty {what} gate to be gone", interval=0.2)
