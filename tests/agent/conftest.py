from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.toolkit.wait import wait_until
from gpufrac.agent.decide.mps_config import daemon_spec
from gpufrac.agent.edges.supervisor import MpsSupervisor, RestartPolicy
from gpufrac.core.annotations import ComputeMode
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


@pytest.fixture
def daemon(tmp_path: Path, mps_binary: str) -> Iterator[MpsSupervisor]:
    """The sm-sharing MPS daemon as the agent starts it on MPS v3 (the fake), up."""
    spec = daemon_spec(ComputeMode.SM_SHARING, mps_v3=True, binary=mps_binary, mps_root=tmp_path / "mps",
                       log_root=tmp_path / "log", config_dir=tmp_path / "config")
    sup = MpsSupervisor(spec, RestartPolicy(0.01, 0.08, 5, 300.0), quit_timeout=5)
    sup.start()
    wait_until(lambda: sup.status().up, timeout=10, what="the fake sm-sharing daemon")
    yield sup
    sup.stop()
