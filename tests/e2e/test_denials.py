"""What alice cannot create: each request is refused by a gpufrac webhook, and kubectl shows her a message
that names the annotation and the value (docs/architecture.md, "One review")."""

from __future__ import annotations

import pytest

from e2e.testing import assert_denied, create, pod, unique
from testkit.pods import IMAGE

pytestmark = pytest.mark.e2e

NV = "nvidia.com/container.app."
PORTION = "kai.scheduler/container.app.gpu-memory.portion.limit"


def _deny(alice, annotations: dict[str, str], *fragments: str, containers=None, **spec) -> str:
    res = create(alice, pod(unique("deny"), annotations, containers, **spec))
    return assert_denied(res, *fragments)


@pytest.mark.parametrize("value", ["1", "0", "-0.5", "1.5", "NaN", "half", "0x1p-1"])
def test_gpu_fraction_out_of_range_or_not_a_decimal(alice, value):
    _deny(alice, {"gpu-fraction": value}, "gpu-fraction", value)


def test_portion_limit_without_gpu_fraction(alice):
    msg = _deny(alice, {PORTION: "0.8"}, PORTION, "0.8")
    assert "gpu-fraction" in msg.replace(PORTION, "")


@pytest.mark.parametrize("value", ["0.4", "0.5"])
def test_portion_limit_not_above_fraction(alice, value):
    _deny(alice, {"gpu-fraction": "0.5", PORTION: value}, PORTION, value)


@pytest.mark.parametrize("value", ["1", "1.2"])
def test_portion_limit_not_below_one(alice, value):
    _deny(alice, {"gpu-fraction": "0.5", PORTION: value}, PORTION, value)


def test_shorthand_fraction_limit_below_fraction(alice):
    _deny(alice, {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.3"}, "gpu-fraction.limit", "0.3")


@pytest.mark.parametrize("value", ["abc", "0"])
def test_gpu_memory_not_a_positive_integer(alice, value):
    _deny(alice, {"gpu-memory": value}, "gpu-memory", value)


def test_gpu_memory_limit_without_unit(alice):
    _deny(alice, {"gpu-memory": "4096", "gpu-memory.limit": "8192"}, "gpu-memory.limit", "8192")


def test_gpu_memory_limit_below_gpu_memory(alice):
    _deny(alice, {"gpu-memory": "4096", "gpu-memory.limit": "2Gi"}, "gpu-memory.limit", "2Gi")


@pytest.mark.parametrize("value", ["lots", "4 Gi", "0", "-1Gi", "512Ki"])
def test_memory_request_unparsable_not_positive_or_below_one_mib(alice, value):
    key = NV + "gpu-memory.request"
    _deny(alice, {key: value}, key, value)


def test_memory_limit_below_request(alice):
    _deny(
        alice,
        {NV + "gpu-memory.request": "40Gi", NV + "gpu-memory.limit": "20Gi"},
        NV + "gpu-memory.limit",
        "20Gi",
    )


def test_gpu_fraction_with_gpu_memory(alice):
    msg = _deny(alice, {"gpu-fraction": "0.5", "gpu-memory": "4096"})
    assert "gpu-fraction" in msg and "gpu-memory" in msg


def test_gpu_fraction_with_user_written_memory_request(alice):
    _deny(
        alice,
        {"gpu-fraction": "0.5", NV + "gpu-memory.request": "10Gi"},
        "gpu-fraction",
        NV + "gpu-memory.request",
    )


def test_whole_gpu_limit_with_fraction(alice):
    containers = [{"name": "app", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    _deny(alice, {"gpu-fraction": "0.5"}, "nvidia.com/gpu", "app", containers=containers)


@pytest.mark.parametrize("value", ["0", "x"])
def test_num_devices_not_a_positive_integer(alice, value):
    _deny(
        alice, {"gpu-fraction": "0.5", "gpu-fraction-num-devices": value}, "gpu-fraction-num-devices", value
    )


def test_num_devices_without_fraction(alice):
    _deny(alice, {"gpu-fraction-num-devices": "2"}, "gpu-fraction-num-devices")


def test_key_names_a_missing_container(alice):
    containers = [{"name": "app", "image": IMAGE}, {"name": "sidecar", "image": "busybox:1.37"}]
    key = "nvidia.com/container.trainer.gpu-memory.request"
    msg = _deny(alice, {key: "20Gi"}, key, containers=containers)
    assert "app" in msg.replace(key, "") and "sidecar" in msg, f"message does not list the containers: {msg}"


def test_malformed_key_under_our_prefix(alice):
    key = "nvidia.com/container.app.gpu-memory"
    _deny(alice, {key: "20Gi"}, key)


def test_unknown_compute_mode(alice):
    _deny(
        alice,
        {NV + "gpu-memory.request": "8Gi", NV + "gpu-compute.mode": "turbo"},
        NV + "gpu-compute.mode",
        "turbo",
    )


def test_mode_on_a_container_without_request(alice):
    _deny(alice, {NV + "gpu-compute.mode": "sm-sharing"}, NV + "gpu-compute.mode")


@pytest.mark.parametrize("limit_key", ["gpu-fraction.limit", "kai.scheduler/container.worker.gpu-memory.portion.limit"])
def test_portion_limit_of_a_container_other_than_the_first_needs_its_name(alice, limit_key):
    """KAI reads a portion limit as the first container's unless gpu-fraction-container-name says otherwise."""
    containers = [{"name": "app", "image": IMAGE}, {"name": "worker", "image": IMAGE}]
    msg = _deny(alice, {"gpu-fraction": "0.5", limit_key: "0.8", "nvidia.com/container.worker.gpu-compute.mode":
                        "time-slicing"}, limit_key, "0.8", containers=containers)
    assert "first container's (app)" in msg and "set gpu-fraction-container-name to worker" in msg


def test_two_containers_with_different_modes(alice):
    containers = [{"name": "app", "image": IMAGE}, {"name": "worker", "image": IMAGE}]
    msg = _deny(
        alice,
        {
            NV + "gpu-memory.request": "8Gi",
            NV + "gpu-compute.mode": "sm-sharing",
            "nvidia.com/container.worker.gpu-memory.request": "8Gi",
            "nvidia.com/container.worker.gpu-compute.mode": "time-slicing",
        },
        "sm-sharing",
        "time-slicing",
        containers=containers,
    )
    assert "app" in msg and "worker" in msg


def test_privileged_fractional_container(alice):
    containers = [{"name": "app", "image": IMAGE, "securityContext": {"privileged": True}}]
    _deny(alice, {"gpu-fraction": "0.25"}, "privileged", "app", containers=containers)


def test_user_sets_devices_on_create(alice):
    key = NV + "gpus.devices"
    _deny(alice, {"gpu-fraction": "0.5", key: "GPU-a"}, key)


def test_wrong_examples_are_denied(alice):
    """Every examples/wrong-*.yaml is refused (they are what `make demo` shows)."""
    from testkit.pods import EXAMPLES

    wrong = sorted(EXAMPLES.glob("wrong-*.yaml"))
    assert len(wrong) >= 5
    for path in wrong:
        res = alice("create", "--dry-run=server", "-f", str(path))
        assert_denied(res)
