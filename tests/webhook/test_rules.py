"""Every value rule of the contract, allowed and denied, through the mutating decision (what a user hears first)
and the validating one (what holds on the final object)."""

from __future__ import annotations

import pytest

from gpufrac.webhook.decide import admission
from testkit.admission import MULTIPLE, POLICY, allowed, denial
from testkit.pods import INFERENCE, NOTEBOOK, pod
from testkit.reviews import review


# The values an e2e test sends too ("1", "0", "NaN", "half", ...) are cases of e2e/denial_corpus.py, checked here in
# process by test_denial_corpus.py.
@pytest.mark.parametrize("value", ["nan", "inf", "", " 0.5", "0.5 ", "1e0", "0,5", "++0.5", "5e-1000"])
def test_gpu_fraction_outside_the_open_unit_interval_is_denied(value):
    message = denial(pod({"gpu-fraction": value}))
    assert message.startswith("annotation gpu-fraction: ")
    assert "strictly between 0 and 1" in message
    assert (value or '""') in message


# 1e-3 was accepted here once: KAI's scheduler hands it to its binder as "0.00", which never binds
# (test_kai_fidelity.py, repro 4's family).
@pytest.mark.parametrize("value", ["0.25", "2.5e-1", ".5", "0.99999", "5e-3", "+0.5"])
def test_gpu_fraction_decimal_numbers_are_accepted(value):
    allowed(pod({"gpu-fraction": value}))


@pytest.mark.parametrize(("annotations", "fragment"), [
    ({"gpu-fraction.limit": "0.8"}, "annotation gpu-fraction.limit: 0.8 can only be used together with the "
                                    "gpu-fraction annotation"),
    ({"gpu-fraction": "0.5", "gpu-fraction.limit": "0.5"}, "must be greater than gpu-fraction (0.5) and less than 1"),
    ({"gpu-fraction": "0.5", "gpu-fraction.limit": "1"}, "gpu-fraction.limit: 1 must be greater than"),
    ({"gpu-fraction": "0.5", "gpu-fraction.limit": "0.5123456"}, "at most 5 digits after the decimal point"),
    ({"gpu-fraction": "0.5", "gpu-fraction.limit": "0.8",
      "kai.scheduler/container.app.gpu-memory.portion.limit": "0.9"}, "does not match gpu-fraction.limit (0.8)"),
])
def test_portion_limits(annotations, fragment):
    assert fragment in denial(pod(annotations))


def test_portion_limit_for_another_container_than_the_fraction_is_denied():
    message = denial(pod({"gpu-fraction": "0.5", "kai.scheduler/container.side.gpu-memory.portion.limit": "0.8"},
                         "app", "side"))
    assert "names container side, but gpu-fraction applies to app; set gpu-fraction-container-name to side" in message


@pytest.mark.parametrize(("annotations", "fragment"), [
    ({"gpu-memory": "1.5"}, "annotation gpu-memory: 1.5 must be"),
    ({"gpu-memory.limit": "2Gi"}, "can only be used together with the gpu-memory annotation"),
])
def test_gpu_memory_shorthand(annotations, fragment):
    assert fragment in denial(pod(annotations))


@pytest.mark.parametrize(("value", "fragment"), [
    ("40GB", "must be a Kubernetes memory quantity"),
    ("1e400", "is larger than any GPU"),
])
def test_memory_quantities(value, fragment):
    message = denial(pod({"nvidia.com/container.app.gpu-memory.request": value}))
    assert f"annotation nvidia.com/container.app.gpu-memory.request: {value} {fragment}" in message


def test_a_portion_and_an_absolute_memory_limit_do_not_mix():
    message = denial(pod({"gpu-fraction": "0.5", "nvidia.com/container.app.gpu-memory.limit": "1Gi"}))
    assert "cannot be used together with gpu-fraction" in message


def test_num_devices_above_64_are_denied():
    assert "from 1 to 64" in denial(pod({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "1000000000"}))


@pytest.mark.parametrize(("key", "fragment"), [
    ("nvidia.com/container..gpu-memory.request", "is not a key gpufrac knows"),
    ("nvidia.com/container.App.gpu-memory.request", "is not a key gpufrac knows"),
    ("kai.scheduler/container.app.gpu-memory.limit", "expected kai.scheduler/container.<container>.<gpu-memory."
                                                     "portion.limit>"),
    ("gpufrac.io/anything", "written by the webhook"),
])
def test_malformed_keys_are_errors_not_ignored(key, fragment):
    message = denial(pod({"gpu-fraction": "0.5", key: "1"}))
    assert f"annotation {key}: is not a key gpufrac knows" in message
    assert fragment in message


def test_a_key_naming_a_missing_container_lists_the_pods_containers():
    message = denial(pod({"nvidia.com/container.trainer.gpu-memory.request": "1Gi"}, "app", "side", init=("setup",)))
    assert "annotation nvidia.com/container.trainer.gpu-memory.request: names container trainer, but the pod has " \
           "app, side, setup" in message


def test_gpu_fraction_container_name_must_exist():
    message = denial(pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "nope"}))
    assert "annotation gpu-fraction-container-name: nope must name a container of the pod: app" in message


def test_gpu_fraction_container_name_may_name_an_init_container():
    outcome = allowed(pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "setup"}, init=("setup",)))
    paths = {op["path"] for op in outcome.patch}
    assert "/spec/initContainers/0/env" in paths or any(p.startswith("/spec/initContainers/0/env") for p in paths)


def test_an_unknown_compute_mode_beside_a_portion_is_denied():
    message = denial(pod({"gpu-fraction": "0.5", "nvidia.com/container.app.gpu-compute.mode": "turbo"}))
    assert "annotation nvidia.com/container.app.gpu-compute.mode: turbo must be time-slicing or sm-sharing" in message


def test_several_containers_of_one_pod_may_each_hold_a_fraction_where_the_binder_binds_each():
    outcome = allowed(pod({"nvidia.com/container.a.gpu-memory.request": "1Gi",
                           "nvidia.com/container.b.gpu-memory.request": "2Gi"}, "a", "b"), MULTIPLE)
    added = {op["path"]: op["value"] for op in outcome.patch if op["op"] == "add"}
    assert added["/metadata/annotations/gpufrac.io~1container.a.gpu-memory.request-mib"] == "1024"
    assert added["/metadata/annotations/gpufrac.io~1container.b.gpu-memory.request-mib"] == "2048"


def test_devices_on_create_are_the_schedulers_alone():
    obj = pod({**INFERENCE, "nvidia.com/container.app.gpus.devices": "GPU-0000aaaa,GPU-0000bbbb,GPU-0000cccc,"
                                                                     "GPU-0000dddd"})
    outcome = admission.mutate(review(obj), POLICY)
    import jsonpatch
    message = admission.validate(review(jsonpatch.apply_patch(obj, outcome.patch)), POLICY).message
    assert "annotation nvidia.com/container.app.gpus.devices: GPU-0000aaaa" in message
    assert "is written by the scheduler at bind (system:serviceaccount:kai-scheduler:binder), not on create" in message


def test_seed_examples_are_allowed():
    allowed(pod(INFERENCE))
    allowed(pod(NOTEBOOK))


def test_long_container_names_that_cannot_carry_the_keys_are_denied():
    name = "a" * 40
    message = denial(pod({f"nvidia.com/container.{name}.gpu-memory.request": "1Gi"}, name))
    assert f"container {name}: has a name longer than" in message


def test_every_violation_is_reported_at_once():
    message = denial(pod({"gpu-fraction": "2", "gpu-fraction-num-devices": "0",
                          "nvidia.com/container.app.gpu-compute.mode": "fast"}))
    assert message.count("; ") >= 2
    assert "gpu-fraction: 2" in message and "num-devices: 0" in message and "mode: fast" in message


def test_hostile_values_are_shown_short_and_quoted():
    message = denial(pod({"gpu-fraction": "\x1b[31m" + "9" * 5000}))
    assert len(message) < 400
    assert "\\u001b" in message and "(5005 characters)" in message


def test_the_container_list_in_a_message_stays_short():
    names = [f"c{i}" for i in range(500)]
    message = denial(pod({"nvidia.com/container.trainer.gpu-memory.request": "1Gi"}, *names))
    assert "but the pod has c0, c1, c2, c3, c4, c5, c6, c7, c8, c9 and 490 more" in message


def test_shorthands_for_a_container_whose_name_cannot_be_in_a_key_are_denied_not_a_crash():
    """Found by the property tests: the translation for container `App` is a key gpufrac cannot parse back."""
    message = denial(pod({"gpu-memory": "1024", "kai.scheduler/gpu-compute-sharing-mode": "sm-sharing"}, "App"))
    assert "container App: has a name that cannot be part of an annotation key" in message
