"""Workloads judged at apply time: the pod template of each kind gets the pod's rules, prefixed by where it is."""

from __future__ import annotations

import copy

import pytest

from gpufrac.webhook.decide import admission
from gpufrac.webhook.decide.errors import BadReviewError
from gpufrac.webhook.decide.workloads import BY_KIND, WORKLOADS, pod_template
from testkit import pods
from testkit.admission import POLICY
from testkit.reviews import review


def workload(kind: str, annotations: dict[str, str], **container_fields) -> dict:
    return pods.workload(kind, annotations, "main", template_labels={"app": "x"}, **container_fields)


def request(obj: dict, operation: str = "CREATE", old: dict | None = None, sub_resource: str = ""):
    kind = BY_KIND[obj["kind"]]
    return review(obj, operation=operation, old=old, sub_resource=sub_resource, kind=kind.kind, group=kind.group,
                  resource=kind.resource)


KINDS = [w.kind for w in WORKLOADS]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_a_wrong_template_is_denied_with_where_it_is(kind, operation):
    obj = workload(kind, {"gpu-fraction": "1.5"})
    old = workload(kind, {"gpu-fraction": "0.5"}) if operation == "UPDATE" else None
    outcome = admission.validate(request(obj, operation, old), POLICY)
    where = BY_KIND[kind].where
    assert outcome.message == f"{where}: annotation gpu-fraction: 1.5 must be a decimal number strictly between 0 " \
                              "and 1, such as 0.5"


def test_the_prefixes_are_the_template_paths():
    assert BY_KIND["Deployment"].where == "spec.template"
    assert BY_KIND["CronJob"].where == "spec.jobTemplate.spec.template"
    assert BY_KIND["PodTemplate"].where == "template"


@pytest.mark.parametrize("kind", KINDS)
def test_a_valid_fractional_template_is_allowed_and_never_mutated(kind):
    obj = workload(kind, {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.8"})
    before = copy.deepcopy(obj)
    assert admission.validate(request(obj), POLICY).allowed
    mutated = admission.mutate(request(obj), POLICY)
    assert mutated.allowed and mutated.patch == [] and obj == before


@pytest.mark.parametrize(("annotations", "fields", "fragment"), [
    ({"gpu-fraction": "0.5", "nvidia.com/container.main.gpus.devices": "GPU-a1b2c3d4"}, {},
     "spec.template: annotation nvidia.com/container.main.gpus.devices: GPU-a1b2c3d4 is written by the scheduler"),
    ({"gpu-fraction": "0.5"}, {"securityContext": {"privileged": True}},
     "spec.template: container main: is privileged"),
    ({"nvidia.com/container.main.gpu-memory.request": "1Gi"}, {"resources": {"limits": {"nvidia.com/gpu": "1"}}},
     "spec.template: container main: asks for whole GPUs"),
    ({"gpu-memory": "2048", "nvidia.com/container.main.gpu-memory.request": "2048Mi"}, {},
     "spec.template: annotation nvidia.com/container.main.gpu-memory.request: 2048Mi says what gpu-memory says"),
])
def test_templates_get_the_pod_rules(annotations, fields, fragment):
    assert fragment in admission.validate(request(workload("Deployment", annotations, **fields)), POLICY).message


def test_an_update_that_keeps_the_template_is_not_judged_again():
    """A template from before gpufrac must not stop its controllers' updates (revision annotations, status)."""
    old = workload("ReplicaSet", {"gpu-fraction": "1.5"})
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {"deployment.kubernetes.io/revision": "2"}
    assert admission.validate(request(new, "UPDATE", old), POLICY).allowed
    new["spec"]["template"]["metadata"]["annotations"]["gpu-fraction"] = "2"
    assert not admission.validate(request(new, "UPDATE", old), POLICY).allowed


def test_subresources_and_templates_without_fractions_are_allowed():
    obj = workload("Deployment", {"gpu-fraction": "1.5"})
    assert admission.validate(request(obj, "UPDATE", obj, sub_resource="status"), POLICY).allowed
    assert admission.validate(request(workload("Job", {"team": "a"})), POLICY).allowed
    assert pod_template({"kind": "Deployment", "spec": {}}, BY_KIND["Deployment"]) is None


def test_a_template_of_the_wrong_type_is_a_bad_review():
    obj = workload("Deployment", {})
    obj["spec"]["template"] = "nope"
    with pytest.raises(BadReviewError, match=r"object\.spec\.template must be an object"):
        admission.validate(request(obj), POLICY)


def test_a_template_denial_is_counted_by_what_it_names():
    from gpufrac.webhook.serve.metrics import denial_reason
    outcome = admission.validate(request(workload("CronJob", {"gpu-fraction": "1.5"})), POLICY)
    (violation,) = outcome.violations
    assert denial_reason(violation) == "annotation gpu-fraction"
    assert str(violation).startswith("spec.jobTemplate.spec.template: annotation gpu-fraction: 1.5")
