"""gpucheck's judgements (pure functions from measured numbers to PASS or FAIL) decide right."""

from __future__ import annotations

from typing import Any

import pytest

from gpucheck import contract as restated
from gpucheck import judge, nvml
from gpucheck.checks import runtime
from gpucheck.checks.attribution import charged_to_row
from gpucheck.contract import MIB
from gpucheck.rows import FAIL, PASS, SKIPPED

# ---- the judgements ----


@pytest.mark.parametrize(("probe", "status"), [
    ({"allocated_mib": 1900, "stopped_by": "oom"}, PASS),
    ({"allocated_mib": 1100, "stopped_by": "oom"}, PASS),
    ({"allocated_mib": 900, "stopped_by": "oom"}, FAIL),  # less than half: not "up to the limit"
    ({"allocated_mib": 2100, "stopped_by": "oom"}, FAIL),  # past the limit
    ({"allocated_mib": 3328, "stopped_by": "max"}, FAIL),  # never failed: no limit at all
    ({"allocated_mib": 1900, "stopped_by": "error", "error_name": "CUDA_ERROR_MPS_CLIENT_TERMINATED"}, FAIL),
    # the device does not allocate this way (VMM, pools: rows 11): nothing to judge
    ({"allocated_mib": 0, "stopped_by": "unsupported", "error_name": "CU_DEVICE_ATTRIBUTE_X is 0"}, SKIPPED),
])
def test_judge_probe(probe: dict[str, Any], status: str) -> None:
    assert judge.judge_probe(2048, probe)[0] == status


@pytest.mark.parametrize(("statuses", "status"), [
    ([PASS, PASS], PASS), ([PASS, SKIPPED], SKIPPED), ([SKIPPED, FAIL], FAIL), ([FAIL, PASS], FAIL)])
def test_a_rows_status_is_its_worst_clients(statuses: list[str], status: str) -> None:
    assert judge.worst(statuses) == status


@pytest.mark.parametrize(("expect", "span", "status"), [
    ("together", 3.1, PASS), ("together", 4.5, FAIL), ("turns", 6.0, PASS), ("turns", 4.5, FAIL),
    ("turns", 3.2, FAIL)])
def test_judge_compute(expect: str, span: float, status: str) -> None:
    assert judge.judge_compute(expect, 3.0, span)[0] == status


def test_judge_pod() -> None:
    host = {"ipc": "ipc:[1]", "mnt": "mnt:[2]", "pid": "pid:[3]"}
    good = {"pid": 1, "ns": {"ipc": "ipc:[9]", "mnt": "mnt:[8]", "pid": "pid:[7]"}, "control_socket": True,
            "hidden": {"/x/log": True}, "shm_marker_visible": True, "control_probe": {"rc": 0, "output": ""}}
    assert judge.judge_pod(good, host, shm_delivered=True) == []
    assert judge.judge_pod(good, host, shm_delivered=False) == ["sees the daemon's /dev/shm"]
    bad = {**good, "pid": 4242, "ns": {**good["ns"], "ipc": "ipc:[1]"}, "hidden": {"/x/log": False},
           "control_probe": {"rc": 1, "output": "Cannot find MPS control daemon process"}}
    problems = judge.judge_pod(bad, host, shm_delivered=True)
    assert len(problems) == 4 and any("Cannot find MPS control" in p for p in problems)


@pytest.mark.parametrize(("seen", "expected", "status"), [
    (["nvidia-uvm", "nvidia1", "nvidiactl"], "nvidia1", PASS),
    (["nvidia1"], "nvidia1", PASS),
    (["nvidia0", "nvidia1", "nvidiactl"], "nvidia1", FAIL),
    (["nvidiactl"], "nvidia1", FAIL),
    ([], None, PASS),
    (["nvidia-uvm", "nvidiactl"], None, PASS),
    (["nvidia3"], None, FAIL),
])
def test_judge_devices(seen: list[str], expected: str | None, status: str) -> None:
    assert judge.judge_devices(seen, expected)[0] == status


def test_judge_container_limits() -> None:
    mib = restated.MIB
    assert judge.judge_container_limits({"soft": 1024 * mib, "hard": 2048 * mib}, 1024, 2048)[0] == PASS
    status, text = judge.judge_container_limits({"soft": 0, "hard": nvml.NVML_DEVICE_MEMORY_LIMIT_MAX}, 1024, 2048)
    assert status == FAIL and "hook did not run" in text
    status, text = judge.judge_container_limits({"soft": 2048 * mib, "hard": 2048 * mib}, 1024, 2048)
    assert status == FAIL and "2048 MiB soft" in text


def test_the_runtime_checks_default_to_gpufracs_image_on_the_node() -> None:
    listed = {"images": [{"id": "sha256:1", "repoTags": ["registry.k8s.io/pause:3.10"]},
                         {"id": "sha256:2", "repoTags": None},
                         {"id": "sha256:3", "repoTags": ["ghcr.io/acme/gpufrac-stub:1", "ghcr.io/acme/gpufrac:0.4.1"]}]}
    assert runtime.gpufrac_image(listed) == "ghcr.io/acme/gpufrac:0.4.1"
    assert runtime.gpufrac_image({"images": listed["images"][:2]}) is None
    assert runtime.gpufrac_image({}) is None


@pytest.mark.parametrize(("memory", "status", "charged_to"), [
    ({11: 1024 * MIB, 12: 1024 * MIB, 90: 300 * MIB}, PASS, "client"),  # each client listed with its own
    ({11: None, 12: None, 90: 2348 * MIB}, PASS, "server"),  # the clients without it, their server with it
    ({90: 2348 * MIB}, PASS, "server"),  # the clients not listed at all
    ({11: None, 12: None, 90: 300 * MIB}, FAIL, "neither"),  # 2 GiB held and nobody charged for it
])
def test_row_6c_says_which_way_the_driver_charges_mps_client_memory(memory: dict[int, int | None], status: str,
                                                                    charged_to: str) -> None:
    numbers: dict[str, Any] = {}
    row = charged_to_row("6c", "attribution: MPS memory charged to", [11, 12], [90], memory, 1024, numbers)
    assert row.status == status and numbers["mps_memory_charged_to"] == charged_to
