from __future__ import annotations

from pathlib import Path

import pytest

from tests.agent.helpers import preload_fake_nvml
from tests.fakes.build import MPS_CONTROL
from tests.fakes.state import FakeGpuState


@pytest.fixture
def fake_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeGpuState:
    """The fake libnvidia-ml.so.1, loaded by the real pynvml, reading a state file this test controls."""
    preload_fake_nvml()
    state = FakeGpuState(tmp_path / "nvml.json")
    monkeypatch.setenv("GPUFRAC_FAKE_NVML", str(state.path))
    return state


@pytest.fixture
def mps_binary() -> str:
    return str(MPS_CONTROL)
