"""KAI fidelity (issue 9): the repros found against KAI's own code, each with the family it belongs to.

Verdicts follow KAI Scheduler's code: its shared validator (pkg/common/resources/gpu_sharing_validation.go), its
admission translation (pkg/admission/webhook/v1alpha2/nvfractions/mutation.go), the fraction container it resolves
(pkg/common/resources/gpu_sharing_container_ref.go) and its binder (pkg/binder/plugins/nvfractions/nv_fractions.go).
Where gpufrac is stricter, the test says why. Containers are `main` and `helper`.
"""

from __future__ import annotations

import jsonpatch
import pytest

from gpufrac.core import annotations as ann
from gpufrac.core.contract import read_canonical
from gpufrac.webhook.decide import admission
from testkit.admission import BINDER, MULTIPLE, POLICY, allowed, created, denial
from testkit.pods import pod
from testkit.reviews import review

MAIN_HELPER = ("main", "helper")
REQUEST = "nvidia.com/container.{}.gpu-memory.request"
LIMIT = "nvidia.com/container.{}.gpu-memory.limit"
MODE = "nvidia.com/container.{}.gpu-compute.mode"
PORTION_LIMIT = "kai.scheduler/container.{}.gpu-memory.portion.limit"


def written(obj, policy=POLICY) -> dict[str, str]:
    return created(obj, policy)["metadata"]["annotations"]


# --- 1. The container the shorthands name and the one the per-container keys name must agree ---------------------


@pytest.mark.parametrize("annotations", [
    {"gpu-fraction-container-name": "main", REQUEST.format("helper"): "1Gi"},
    {"gpu-fraction-container-name": "main", LIMIT.format("helper"): "1Gi"},
    {"gpu-fraction-container-name": "main", "gpu-fraction": "0.5", MODE.format("helper"): "sm-sharing"},
    {"gpu-fraction-container-name": "main", MODE.format("helper"): "sm-sharing"},
    {"gpu-fraction-container-name": "main", "gpu-memory": "1024", REQUEST.format("helper"): "1Gi"},
    {"gpu-fraction-container-name": "main", "gpu-fraction": "0.5", PORTION_LIMIT.format("helper"): "0.8"},
], ids=["request", "limit", "mode-with-fraction", "mode-alone", "memory-and-request", "portion-limit"])
def test_repro1_container_name_main_with_keys_for_helper_is_denied(annotations):
    message = denial(pod(annotations, *MAIN_HELPER))
    assert "names container helper, but gpu-fraction-container-name is main" in message


def test_repro1_container_name_helper_with_memory_and_a_request_on_main_is_denied():
    message = denial(pod({"gpu-fraction-container-name": "helper", "gpu-memory": "1024",
                          REQUEST.format("main"): "1Gi"}, *MAIN_HELPER))
    assert f"annotation {REQUEST.format('main')}: 1Gi names container main, but gpu-fraction-container-name is " \
           "helper" in message


# --- 2. Shorthands apply to the container KAI's GetFractionContainerRef picks, never to a second one -------------


def test_repro2_memory_shorthand_with_a_request_on_helper_applies_to_helper():
    """Issue 25: the container the nvidia.com/container. keys name is the shorthands' target, as in KAI."""
    annotations = written(pod({"gpu-memory": "2000", REQUEST.format("helper"): "2000Mi"}, *MAIN_HELPER))
    assert not any(k.startswith("gpufrac.io/container.main.") for k in annotations)
    assert annotations["gpufrac.io/container.helper.gpu-memory.request-mib"] == "2000"
    assert REQUEST.format("main") not in annotations


@pytest.mark.parametrize(("shorthand", "fragment"), [
    ({"gpu-fraction": "0.5"}, "cannot be used together with gpu-fraction"),
    ({"gpu-memory": "1024"}, "cannot be used together with gpu-memory alone"),
    ({"kai.scheduler/gpu-compute-sharing-mode": "sm-sharing", "gpu-memory": "1024"},
     "cannot be used together with gpu-memory alone"),
])
def test_repro2_family_a_shorthand_with_a_limit_on_another_container_is_denied_as_kai_does(shorthand, fragment):
    """KAI moves the shorthand to helper too, then denies the limit beside it ("cannot combine ...")."""
    message = denial(pod({**shorthand, LIMIT.format("helper"): "2Gi"}, *MAIN_HELPER))
    assert f"annotation {LIMIT.format('helper')}: 2Gi {fragment}" in message


# --- 3. Translated quantities in Kubernetes' canonical form ------------------------------------------------------


@pytest.mark.parametrize(("mib", "canonical"), [("2048", "2Gi"), ("1024", "1Gi"), ("3072", "3Gi"), ("2000", "2000Mi"),
                                                 ("1536", "1536Mi"), ("1048576", "1Ti"), ("02048", "2Gi"),
                                                 ("1", "1Mi"), ("4194304", "4Ti")])
def test_repro3_gpu_memory_is_translated_as_kubernetes_writes_the_quantity(mib, canonical):
    assert written(pod({"gpu-memory": mib}, "main"))[REQUEST.format("main")] == canonical


def test_repro3_family_a_request_written_in_another_spelling_is_denied_on_create():
    """KAI's admission writes 2Gi only where the key is absent, and denies a different string already there."""
    message = denial(pod({"gpu-memory": "2048", REQUEST.format("main"): "2048Mi"}, "main"))
    assert f"annotation {REQUEST.format('main')}: 2048Mi says what gpu-memory says, written differently; KAI's " \
           "admission compares the text and denies it: write 2Gi or drop one of them" in message
    assert written(pod({"gpu-memory": "2048", REQUEST.format("main"): "2Gi"}, "main"))[REQUEST.format("main")] == "2Gi"
    message = denial(pod({"gpu-memory": "2048", REQUEST.format("main"): "3Gi"}, "main"))
    assert "3Gi does not match gpu-memory (2Gi)" in message


@pytest.mark.parametrize(("annotations", "key", "shown"), [
    ({"gpu-memory": "4096", "gpu-memory.limit": "8Gi", LIMIT.format("main"): "8192Mi"}, LIMIT, "8192Mi"),
    ({"gpu-fraction": "0.5", "gpu-fraction.limit": "0.8", PORTION_LIMIT.format("main"): "0.80"}, PORTION_LIMIT,
     "0.80"),
])
def test_repro3_family_the_other_translations_are_compared_as_text(annotations, key, shown):
    message = denial(pod(annotations, "main"))
    assert f"annotation {key.format('main')}: {shown} says what" in message


def test_repro3_family_a_pod_written_by_an_older_gpufrac_still_binds():
    """After CREATE, values are compared as values (KAI's validator does): 2048Mi from before still binds."""
    old = created(pod({"gpu-memory": "2048"}, "main"))
    old["metadata"]["annotations"][REQUEST.format("main")] = "2048Mi"  # what gpufrac wrote before
    new = jsonpatch.apply_patch(old, [{"op": "add", "path": "/metadata/annotations/nvidia.com~1container.main.gpus."
                                       "devices", "value": "GPU-a1b2c3d4"}])
    outcome = admission.validate(review(new, operation="UPDATE", old=old, user=BINDER), POLICY)
    assert outcome.allowed, outcome.message


# --- 4. A fraction is what the scheduler reads: binary64, then two decimals to the binder --------------------------


@pytest.mark.parametrize(("value", "fragment"), [
    ("1e-400", "is 0 as KAI's scheduler reads it (a binary64 number)"),
    ("4.9e-325", "is 0 as KAI's scheduler reads it"),
    ("0.99999999999999999", "is 1 as KAI's scheduler reads it"),
    ("0.004", "as 0.00, and a portion of 0.00 is never bound; use 0.005 or more"),
    ("1e-3", "as 0.00"),
    ("4.9e-324", "as 0.00"),
])
def test_repro4_fractions_the_scheduler_reads_as_0_or_1_are_denied(value, fragment):
    message = denial(pod({"gpu-fraction": value}, "main"))
    assert message.startswith(f"annotation gpu-fraction: {value} ") and fragment in message


@pytest.mark.parametrize("value", ["0.005", "0.995", "0.9999999999999999"])
def test_repro4_family_the_edges_that_do_bind_are_allowed(value):
    allowed(pod({"gpu-fraction": value}, "main"))


def test_repro4_family_a_portion_limit_at_1_as_binary64_is_denied():
    message = denial(pod({"gpu-fraction": "0.5", "gpu-fraction.limit": "0.99999999999999999"}, "main"))
    assert "annotation gpu-fraction.limit: 0.99999999999999999 must be greater than gpu-fraction (0.5) and less " \
           "than 1" in message


# --- 5. What KAI's parsers accept, gpufrac accepts (signs) -----------------------------------------------------------


@pytest.mark.parametrize("annotations", [
    {"gpu-fraction": "+0.5"}, {"gpu-fraction": "+.5"}, {"gpu-fraction": "0.5", "gpu-fraction.limit": "+0.8"},
    {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "+2"},
    {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "02"},
])
def test_repro5_signed_numbers_kai_parses_are_accepted(annotations):
    allowed(pod(annotations, "main"))


def test_repro5_family_gpu_memory_has_no_sign_in_kai_either():
    """strconv.ParseUint takes no sign: KAI denies +2048 too."""
    assert "annotation gpu-memory: +2048 must be a positive whole number of MiB" in denial(pod({"gpu-memory": "+2048"}))


# --- 6. E and Ei are units --------------------------------------------------------------------------------------------


def test_repro6_exa_is_a_unit_and_exbibytes_beyond_one_are_beyond_any_gpu():
    assert written(pod({"gpu-memory": "1024", "gpu-memory.limit": "1E"}, "main"))[LIMIT.format("main")] == "1E"
    message = denial(pod({"gpu-memory": "1024", "gpu-memory.limit": "3Ei"}, "main"))
    assert "annotation gpu-memory.limit: 3Ei is larger than any GPU" in message
    assert "unit" not in message


@pytest.mark.parametrize(("value", "verdict"), [("1E", True), ("1Ei", True), ("2Ei", False), ("1e3", False),
                                                ("1E3", False), ("8192", False), ("8Gi", True), ("8192Mi", True)])
def test_repro6_family_units_as_kai_reads_them(value, verdict):
    obj = pod({"gpu-memory": "1024", "gpu-memory.limit": value}, "main")
    if verdict:
        allowed(obj)
    else:
        message = denial(obj)
        assert ("with a unit" in message) is (value in ("1e3", "1E3", "8192")), message


def test_repro6_family_the_largest_limit_admitted_is_read_back_by_the_node():
    annotations = written(pod({LIMIT.format("main"): "1Ei"}, "main"))
    read = read_canonical(annotations)
    assert read.unreadable == ()
    assert read.fractions["main"].limit_mib == 1 << 40 and read.fractions["main"].pinned_mem_limit_mib == {0: 1 << 40}


# --- 7. Container name length, per key the pod uses -------------------------------------------------------------------


def test_repro7_a_30_character_name_with_a_memory_request_fits_every_key():
    name = "c" * 30
    annotations = written(pod({REQUEST.format(name): "1Gi"}, name))
    assert all(ann.key_fits(key) for key in annotations)


@pytest.mark.parametrize(("length", "annotations", "allowed_length"), [
    (31, {REQUEST: "1Gi"}, 30),
    (29, {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.8"}, 28),
    (40, {REQUEST: "1Gi"}, 30),
])
def test_repro7_family_names_too_long_for_a_key_they_need(length, annotations, allowed_length):
    name = "c" * length
    message = denial(pod({k.format(name): v for k, v in annotations.items()}, name))
    assert f"container {name}: has a name longer than {allowed_length} characters, too long for the annotation key" \
           in message


def test_repro7_family_a_29_character_fraction_without_a_portion_limit_fits():
    allowed(pod({"gpu-fraction": "0.5"}, "c" * 29))


# --- 8. Where KAI judges the text, gpufrac does; compare exact bytes -----------------------------------------------


@pytest.mark.parametrize(("limit", "verdict"), [("0.800000", False), ("0.80000", True), ("0.85", True),
                                                ("0.12345e-0", False), ("8.0e-1", True)])
def test_repro8_portion_limit_digits_are_counted_in_the_text(limit, verdict):
    obj = pod({"gpu-fraction": "0.1", "gpu-fraction.limit": limit}, "main")
    if verdict:
        allowed(obj)
    else:
        assert "must have at most 5 digits after the decimal point" in denial(obj)


def test_repro8_gpu_memory_with_a_per_container_limit_is_denied():
    message = denial(pod({"gpu-memory": "2000", LIMIT.format("main"): "4000Mi"}, "main"))
    assert f"annotation {LIMIT.format('main')}: 4000Mi cannot be used together with gpu-memory alone" in message
    allowed(pod({"gpu-memory": "2000", "gpu-memory.limit": "4000Mi", LIMIT.format("main"): "4000Mi"}, "main"))


@pytest.mark.parametrize(("annotations", "verdict"), [
    ({REQUEST.format("main"): "2000Mi", LIMIT.format("main"): "2047999Ki"}, False),
    ({REQUEST.format("main"): "2000Mi", LIMIT.format("main"): "2048000Ki"}, True),
    ({"gpu-memory": "2000", "gpu-memory.limit": "2047999Ki"}, False),
    ({"gpu-memory": "2000", "gpu-memory.limit": "2048000Ki"}, True),
    ({REQUEST.format("main"): "1000M", LIMIT.format("main"): "999999999"}, False),
])
def test_repro8_limits_are_compared_with_requests_in_exact_bytes(annotations, verdict):
    obj = pod(annotations, "main")
    if verdict:
        allowed(obj)
    else:
        assert "must not be smaller than" in denial(obj)


# --- 9. One fraction container per pod, unless the binder binds several -----------------------------------------------


@pytest.mark.parametrize(("annotations", "init"), [
    ({REQUEST.format("main"): "1Gi", REQUEST.format("helper"): "1Gi"}, ()),
    ({REQUEST.format("main"): "1Gi", LIMIT.format("helper"): "1Gi"}, ()),
    ({REQUEST.format("main"): "1Gi", REQUEST.format("setup"): "1Gi"}, ("setup",)),
], ids=["two-requests", "request-and-limit", "init-container"])
def test_repro9_several_fraction_containers_are_denied_by_default(annotations, init):
    message = denial(pod(annotations, *MAIN_HELPER, init=init))
    assert "pod: asks for GPU fractions in 2 containers" in message
    assert "KAI's binder binds the fraction of one container per pod, so this pod would never start" in message
    allowed(pod(annotations, *MAIN_HELPER, init=init), MULTIPLE)


# --- 10. Messages that say what is wrong ------------------------------------------------------------------------------


def test_repro10_the_binder_is_told_why_it_may_not_add_a_key():
    old = created(pod({REQUEST.format("main"): "1Gi"}, *MAIN_HELPER))
    for key, fragment in [(LIMIT.format("main"), "container main asked for absolute memory, which is written on "
                                                 "create; the scheduler adds gpu-memory.request and .limit at bind "
                                                 "only for a portion (gpu-fraction)"),
                          (REQUEST.format("helper"), "container helper holds no GPU fraction, so there is nothing to "
                                                     "bind for it; main of this pod holds one")]:
        new = jsonpatch.apply_patch(old, [{"op": "add", "path": "/metadata/annotations/" + key.replace("/", "~1"),
                                           "value": "2Gi"}])
        message = admission.validate(review(new, operation="UPDATE", old=old, user=BINDER), POLICY).message
        assert f"cannot be added by {BINDER}: {fragment}" in message
        assert "only the scheduler may add it" not in message


def test_repro10_a_mode_on_helper_beside_gpu_fraction_puts_the_portion_on_helper():
    """Issue 25: KAI's binder writes the portion's memory for helper, the container the mode key names."""
    annotations = written(pod({"gpu-fraction": "0.5", MODE.format("helper"): "sm-sharing"}, *MAIN_HELPER))
    assert annotations["gpufrac.io/container.helper.compute-mode"] == "sm-sharing"
    assert not any(k.startswith("gpufrac.io/container.main.") for k in annotations)
    allowed(pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "helper", MODE.format("helper"): "sm-sharing"},
                *MAIN_HELPER))


def test_repro10_family_a_mode_alone_on_another_container_names_what_it_needs():
    message = denial(pod({MODE.format("helper"): "sm-sharing"}, *MAIN_HELPER))
    assert f"needs a GPU memory request for container helper ({REQUEST.format('helper')} or gpu-fraction)" in message


@pytest.mark.parametrize(("value", "fragment"), [
    ("1099511627777", "is more than 1099511627776 MiB (1 EiB), the most gpufrac accepts for one device"),
    ("99999999999999999999", "is more than 1099511627776 MiB"),
])
def test_repro10_gpu_memory_beyond_the_bound_names_the_bound(value, fragment):
    message = denial(pod({"gpu-memory": value}))
    assert f"annotation gpu-memory: {value} {fragment}" in message and "positive whole number" not in message
    allowed(pod({"gpu-memory": "1099511627776"}))


def test_repro10_a_portion_limit_in_scientific_notation_is_shown_plainly():
    message = denial(pod({"gpu-fraction": "0.5", PORTION_LIMIT.format("app"): "812345e-6"}))
    assert f"annotation {PORTION_LIMIT.format('app')}: 812345e-6 is 0.812345, which has 6 digits after the decimal " \
           "point; at most 5 are allowed" in message


def test_repro10_family_too_many_devices_says_why():
    message = denial(pod({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "65"}))
    assert "from 1 to 64 (gpufrac sets one MPS memory limit per device, for at most 64)" in message


# --- KAI's pod-level compute mode -------------------------------------------------------------------------------------


def test_the_compute_mode_shorthand_is_translated_like_the_others():
    annotations = written(pod({"gpu-fraction": "0.5", "kai.scheduler/gpu-compute-sharing-mode": "sm-sharing"},
                              *MAIN_HELPER))
    assert annotations[MODE.format("main")] == "sm-sharing"
    assert annotations["gpufrac.io/container.main.compute-mode"] == "sm-sharing"
    assert MODE.format("helper") not in annotations


@pytest.mark.parametrize(("annotations", "fragment"), [
    ({"gpu-fraction": "0.5", "kai.scheduler/gpu-compute-sharing-mode": "turbo"},
     "annotation kai.scheduler/gpu-compute-sharing-mode: turbo must be time-slicing or sm-sharing"),
    ({"gpu-fraction": "0.5", "kai.scheduler/gpu-compute-sharing-mode": "sm-sharing",
      MODE.format("main"): "time-slicing"}, "time-slicing does not match kai.scheduler/gpu-compute-sharing-mode"),
])
def test_the_compute_mode_shorthand_is_judged_like_the_others(annotations, fragment):
    assert fragment in denial(pod(annotations, "main"))


def test_the_compute_mode_shorthand_is_a_fraction_key():
    assert ann.is_fraction_key("kai.scheduler/gpu-compute-sharing-mode")
