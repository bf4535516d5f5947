"""Inventory through the real pynvml + fake libnvidia-ml.so.1, and what a node can enforce."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufrac.agent.decide import capabilities
from gpufrac.agent.decide.errors import NvmlError
from gpufrac.agent.decide.model import DaemonState, DaemonStatus, Inventory
from gpufrac.agent.decide.mps_config import MULTI_USER_V3, daemon_spec, multi_user_modes
from gpufrac.agent.edges.nvml import NvmlSource
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import Enforcement
from testkit.agent import UUID_A, UUID_B, gpu_info

TS, SM = ComputeMode.TIME_SLICING, ComputeMode.SM_SHARING
BOTH = (TS, SM)


def up(mode: ComputeMode) -> DaemonStatus:
    return DaemonStatus(mode, DaemonState.RUNNING, True, 0)


def down(mode: ComputeMode, state: DaemonState = DaemonState.BACKOFF, failure: str | None = None) -> DaemonStatus:
    return DaemonStatus(mode, state, False, 3, failure)


def inventory(driver: str, cuda: int, gpus: int = 2) -> Inventory:
    return Inventory(driver, cuda, tuple(gpu_info(i, f"GPU-{i:08x}-0000-0000-0000-000000000000")
                                         for i in range(gpus)))


def test_inventory_from_nvml(fake_gpus):
    fake_gpus.set(driver_version="615.20", cuda_driver_version=13040)
    fake_gpus.gpu(UUID_A, memory_total_mib=143771).gpu(UUID_B, name="NVIDIA H100 80GB HBM3", memory_total_mib=81559)
    inv = NvmlSource().inventory()
    assert inv.driver_version == "615.20"
    assert inv.cuda_driver_version == 13040
    assert [(g.index, g.uuid, g.name, g.memory_total_mib) for g in inv.gpus] == [
        (0, UUID_A, "NVIDIA H200", 143771), (1, UUID_B, "NVIDIA H100 80GB HBM3", 81559)]


def test_inventory_follows_the_state_file(fake_gpus):
    source = NvmlSource()
    fake_gpus.set(driver_version="550.54.15", cuda_driver_version=12040).gpu(UUID_A)
    assert source.inventory().driver_version == "550.54.15"
    fake_gpus.set(driver_version="615.20", cuda_driver_version=13040)
    assert source.inventory().driver_version == "615.20"


@pytest.mark.parametrize("breakage", ["missing", "corrupt", "injected-everywhere", "injected-one-call"])
def test_nvml_failures_become_nvml_errors(fake_gpus, breakage):
    fake_gpus.gpu(UUID_A)
    if breakage == "missing":
        fake_gpus.path.unlink()
    elif breakage == "corrupt":
        fake_gpus.path.write_text('{"driver_version": "615.20", "gpus": [')
    elif breakage == "injected-everywhere":
        fake_gpus.set(error=9)
    else:
        fake_gpus.set(error={"function": "nvmlDeviceGetMemoryInfo", "code": 15})
    with pytest.raises(NvmlError) as err:
        NvmlSource().inventory()
    expected = {"missing": "Driver Not Loaded", "corrupt": "Unknown Error",
                "injected-everywhere": "Driver Not Loaded", "injected-one-call": "GPU is lost"}[breakage]
    assert expected in str(err.value)


def test_nvml_recovers_after_an_error(fake_gpus):
    fake_gpus.gpu(UUID_A).set(error=9)
    source = NvmlSource()
    with pytest.raises(NvmlError):
        source.inventory()
    fake_gpus.state.pop("error")
    fake_gpus.write()
    assert [g.uuid for g in source.inventory().gpus] == [UUID_A]


# ---- what a node can enforce ----

@pytest.mark.parametrize(("driver", "cuda", "daemons", "expected"), [
    # r615 + CUDA 13.4: the driver enforces both modes; sm-sharing needs its shared server
    ("615.20", 13040, {TS: up(TS), SM: up(SM)}, {TS: "driver", SM: "driver"}),
    ("615.20", 13040, {TS: up(TS), SM: down(SM)}, {TS: "driver", SM: "none"}),
    ("620.1", 13050, {TS: down(TS), SM: up(SM)}, {TS: "driver", SM: "driver"}),
    # r615 whose CUDA driver API is older than 13.4: no memory limits
    ("615.20", 13030, {SM: up(SM)}, {TS: "none", SM: "mps"}),
    # 580 and 550: legacy MPS pinned limits for sm-sharing only, never time-slicing through a shared server
    ("580.65.06", 13000, {SM: up(SM)}, {TS: "none", SM: "mps"}),
    ("550.54.15", 12040, {SM: up(SM)}, {TS: "none", SM: "mps"}),
    ("550.54.15", 12040, {SM: down(SM, DaemonState.FAILED, "exited")}, {TS: "none", SM: "none"}),
])
def test_enforcement_by_driver(driver, cuda, daemons, expected):
    inv = inventory(driver, cuda)
    enforced = capabilities.enforcement(inv, BOTH, daemons)
    assert {m: str(v) for m, v in enforced.items()} == expected
    labels = capabilities.node_labels(inv, enforced)
    assert labels == {
        "gpufrac.io/driver-version.major": driver.split(".")[0],
        "gpufrac.io/gpu-count": "2",
        "gpufrac.io/enforcement.time-slicing": expected[TS],
        "gpufrac.io/enforcement.sm-sharing": expected[SM],
    }


@pytest.mark.parametrize(("driver", "cuda", "served"), [
    ("615.20", 13040, (TS, SM)),
    ("615.20", 13030, (SM,)),
    ("580.65.06", 13000, (SM,)),
    ("550.54.15", 12040, (SM,)),
])
def test_time_slicing_gets_no_shared_daemon_without_driver_limits(driver, cuda, served):
    assert capabilities.modes_to_serve(inventory(driver, cuda), BOTH) == served


def test_disabled_mode_is_neither_served_nor_claimed():
    inv = inventory("615.20", 13040)
    assert capabilities.modes_to_serve(inv, (TS,)) == (TS,)
    assert capabilities.enforcement(inv, (TS,), {SM: up(SM)})[SM] is Enforcement.NONE


def test_condition_true_when_everything_is_enforced():
    inv = inventory("615.20", 13040)
    daemons = {TS: up(TS), SM: up(SM)}
    cond = capabilities.node_condition(inv, BOTH, capabilities.enforcement(inv, BOTH, daemons), daemons)
    assert (cond.status, cond.reason) == ("True", "FractionsEnforced")
    assert "time-slicing: driver, sm-sharing: driver" in cond.message


def test_condition_old_driver_says_what_to_do():
    inv = inventory("550.54", 12040)
    daemons = {SM: up(SM)}
    # sm-sharing is still enforced: True (KAI places fractions), the reason and message say what is not
    cond = capabilities.node_condition(inv, BOTH, capabilities.enforcement(inv, BOTH, daemons), daemons)
    assert (cond.status, cond.reason) == ("True", "DriverWithoutMemoryLimits")
    assert cond.message == ("GPU memory fractions are enforced (sm-sharing: mps) on 2 GPU(s); not time-slicing: "
                            "driver 550.54 (CUDA 12.4) has no CUDA 13.4 memory limits: time-slicing fractions "
                            "cannot be enforced on this node and are refused here (node label "
                            "gpufrac.io/enforcement.time-slicing=none); upgrade to r615+")
    # time-slicing alone: nothing this driver can enforce
    cond = capabilities.node_condition(inv, (TS,), capabilities.enforcement(inv, (TS,), {}), {})
    assert (cond.status, cond.reason) == ("False", "DriverWithoutMemoryLimits")
    assert cond.message.startswith("driver 550.54 (CUDA 12.4) has no CUDA 13.4 memory limits")


def test_condition_old_driver_fine_when_only_sm_sharing_is_enabled():
    inv = inventory("550.54", 12040)
    daemons = {SM: up(SM)}
    cond = capabilities.node_condition(inv, (SM,), capabilities.enforcement(inv, (SM,), daemons), daemons)
    assert cond.status == "True"
    assert "sm-sharing: mps" in cond.message


def test_condition_failed_daemon_comes_first_and_lists_every_problem():
    inv = inventory("550.54", 12040)
    daemons = {SM: down(SM, DaemonState.FAILED, "exited with code 1 and was restarted 5 times")}
    cond = capabilities.node_condition(inv, BOTH, capabilities.enforcement(inv, BOTH, daemons), daemons)
    assert (cond.status, cond.reason) == ("False", "MpsDaemonFailed")
    assert "sm-sharing MPS control daemon exited with code 1 and was restarted 5 times" in cond.message
    assert "upgrade to r615+" in cond.message


def test_condition_daemon_not_up_yet():
    inv = inventory("615.20", 13040)
    daemons = {TS: up(TS), SM: down(SM, DaemonState.STARTING)}
    cond = capabilities.node_condition(inv, BOTH, capabilities.enforcement(inv, BOTH, daemons), daemons)
    assert (cond.status, cond.reason) == ("False", "MpsDaemonNotReady")


def test_condition_without_nvml_or_gpus():
    cond = capabilities.node_condition(None, BOTH, {}, {}, nvml_error="NVML: Driver Not Loaded")
    assert (cond.status, cond.reason) == ("False", "NvmlUnavailable")
    assert "Driver Not Loaded" in cond.message
    assert capabilities.node_labels(None, capabilities.enforcement(inventory("615.20", 13040, 0), BOTH, {})) == {
        "gpufrac.io/enforcement.time-slicing": "none", "gpufrac.io/enforcement.sm-sharing": "none"}
    cond = capabilities.node_condition(inventory("615.20", 13040, 0), BOTH, {}, {})
    assert cond.reason == "NoGpus"


def test_condition_memory_budget_problem():
    inv = inventory("615.20", 13040, gpus=8)
    daemons = {TS: up(TS), SM: up(SM)}
    from gpufrac.agent.decide.mps_config import memory_problem
    problem = memory_problem(256 * 1024 * 1024, 8, 2)
    assert problem is not None and "1152Mi" in problem
    assert memory_problem(2048 * 1024 * 1024, 8, 2) is None
    assert memory_problem(None, 8, 2) is None
    cond = capabilities.node_condition(inv, BOTH, capabilities.enforcement(inv, BOTH, daemons), daemons,
                                       memory_problem=problem)
    assert (cond.status, cond.reason) == ("False", "MpsMemoryBudgetTooSmall")


@pytest.mark.parametrize(("driver", "cuda", "major", "time_slicing", "sm_sharing"), [
    ("550.54.15", 12040, "550", "none", "mps"),
    ("580.65.06", 13000, "580", "none", "mps"),
    ("615.20", 13030, "615", "none", "mps"),
    ("615.20", 13040, "615", "driver", "driver"),
    ("620.1.2", 13050, "620", "driver", "driver"),
])
def test_labels_from_nvml_for_each_driver(fake_gpus, driver, cuda, major, time_slicing, sm_sharing):
    fake_gpus.set(driver_version=driver, cuda_driver_version=cuda).gpu(UUID_A).gpu(UUID_B)
    inv = NvmlSource().inventory()
    daemons = {m: up(m) for m in capabilities.modes_to_serve(inv, BOTH)}
    labels = capabilities.node_labels(inv, capabilities.enforcement(inv, BOTH, daemons))
    assert labels == {"gpufrac.io/driver-version.major": major, "gpufrac.io/gpu-count": "2",
                      "gpufrac.io/enforcement.time-slicing": time_slicing,
                      "gpufrac.io/enforcement.sm-sharing": sm_sharing}


def test_only_the_mps_v3_sm_sharing_daemon_serves_every_user() -> None:
    """What the NRI plugin holds fractions to (row 5): a daemon without `-m` serves one UID at a time."""
    assert multi_user_modes(inventory("615.20", 13040, 1)) == {ComputeMode.SM_SHARING}
    assert multi_user_modes(inventory("580.95.05", 13000, 1)) == frozenset()  # legacy MPS: no -m
    assert multi_user_modes(None) == frozenset()
    v3 = {mode: daemon_spec(mode, mps_v3=True, binary="mps", mps_root=Path("/m"), log_root=Path("/l"),
                            config_dir=Path("/c")).argv for mode in ComputeMode}
    assert {mode for mode, argv in v3.items() if "-m" in argv} == MULTI_USER_V3
