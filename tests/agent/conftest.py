from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.agent import FakeNode, preload_fake_nvml
from testkit.fakes.build import MPS_CONTROL
from testkit.fakes.state import FakeGpuState


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


@pytest.fixture
def fake_node(tmp_path: Path, fake_gpus: FakeGpuState, mps_binary: str) -> Iterator[FakeNode]:
    """Two GPUs, two fractional pods and the agent's settings (testkit.agent.FakeNode); its agents stop after."""
    node = FakeNode.two_pods(tmp_path, fake_gpus, mps_binary)
    yield node
    node.close()
