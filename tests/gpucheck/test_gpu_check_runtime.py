"""gpucheck's runtime rows (8a-8c) for real: containerd 2 from the tools cache with its CRI, NRI and CDI on, the
agent's NRI plugin (its own code: NriPlugin, the wire session, decide), fake GPU device nodes (c 1:3, in this test's
own directory) named by CDI specs of NVIDIA's shape, and crictl making the pods as it does on a GPU node. No kubelet
(it removes pods it did not make) and no NVIDIA runtime, so an env var gives nothing: what a container sees under
/dev is what the plugin, through containerd's CDI, handed it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cri_harness import crictl, registered_plugin, started_cri_node
from e2e.node import APP_IMAGE, GPU_UUIDS
from e2e.toolkit.cri_node import CriNode
from gpucheck.rows import FAIL, PASS, SKIPPED
from gpufrac.agent.nri.decide.creation import ContainerInfo, Injection, PodInfo, Refusal
from gpufrac.agent.nri.plugin import PluginState
from testkit.fakes.build import MPS_CONTROL, fake_nvml_library

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
FAKE_NODE = ROOT / "testkit" / "fakes" / "gpu_check_node.json"



class Sink:
    def __init__(self) -> None:
        self.states: list[PluginState] = []
        self.outcomes: list[tuple[str, str]] = []  # (container, outcome)

    def decided(self, pod: PodInfo, container: ContainerInfo, result: Injection | Refusal) -> None:
        self.outcomes.append((container.name, str(result.outcome)))

    def state_changed(self, state: PluginState) -> None:
        self.states.append(state)

    def swept(self, found: object) -> None:
        self.outcomes.append(("swept", str(found)))


@pytest.fixture
def node() -> Iterator[CriNode]:
    with started_cri_node("gc", pytest.skip) as started:
        yield started


@pytest.fixture
def plugin(node: CriNode) -> Iterator[Sink]:
    """The agent's NRI plugin registered with the node's containerd, deciding with the node's CDI specs."""
    sink = Sink()
    with registered_plugin(node, sink, "gpucheck-test"):
        yield sink


def run_rows(node: CriNode, tmp_path: Path, *image: str) -> dict[str, dict[str, Any]]:
    """The check's rows 8a-8c against the node, on its GPU 1 (the fake NVML lists the node's GPUs)."""
    state = json.loads(FAKE_NODE.read_text())
    state["gpus"] = [{**state["gpus"][0], "uuid": uuid} for uuid in GPU_UUIDS]
    (tmp_path / "node.json").write_text(json.dumps(state))
    result = subprocess.run(
        [sys.executable, str(ROOT / "gpucheck" / "__main__.py"), "--only", "8", "--gpu", "1",
         "--crictl", str(crictl()), "--runtime-endpoint", f"unix://{node.socket}", *image,
         "--nvml", str(fake_nvml_library()), "--mps-control", str(MPS_CONTROL), "--cuda", "none",
         "--workdir", str(tmp_path / "work"), "--out", str(tmp_path / "report.json")],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "GPUFRAC_FAKE_NVML": str(tmp_path / "node.json")})
    assert (tmp_path / "report.json").is_file(), result.stdout[-3000:] + result.stderr[-3000:]
    rows = {c["id"]: c for c in json.loads((tmp_path / "report.json").read_text())["checks"]}
    assert not node.containers(), "the check left containers behind"
    return rows


def test_the_cdi_pod_sees_exactly_its_gpu_and_the_plain_pod_none(node: CriNode, plugin: Sink, tmp_path: Path) -> None:
    # no --image: the check takes gpufrac's, as a gpufrac node has it (here the app image under that name)
    tagged = node.containerd.ctr("images", "tag", APP_IMAGE, "localhost/gpufrac:gpu-check")
    assert tagged.returncode == 0, tagged.stderr
    rows = run_rows(node, tmp_path)
    assert rows["8a"]["status"] == PASS, rows["8a"]
    assert "sees exactly /dev/nvidia1" in rows["8a"]["details"]
    assert f"k8s.device-plugin.nvidia.com/gpu={GPU_UUIDS[1]}" in rows["8a"]["details"]
    assert rows["8c"]["status"] == PASS and "no GPU device" in rows["8c"]["details"], rows["8c"]
    assert ("app", "injected") in plugin.outcomes and ("plain", "voided") in plugin.outcomes
    # the test's CDI specs carry no apply-cuda-memory-limits hook (the fake driver has no toolkit): where the 13.4
    # limits can be read (cgroup v2), the row says the hook did not run; on cgroup v1 it says why it cannot tell
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        assert rows["8b"]["status"] == FAIL and "hook did not run" in rows["8b"]["details"], rows["8b"]
    else:
        assert rows["8b"]["status"] == SKIPPED and "cgroup v2" in rows["8b"]["details"], rows["8b"]


def test_without_the_plugin_the_cdi_pod_gets_no_gpu_and_its_row_fails(node: CriNode, tmp_path: Path) -> None:
    """Nobody hands the fraction its CDI device: the row that checks it fails, naming what the container saw."""
    rows = run_rows(node, tmp_path, "--image", APP_IMAGE)
    assert rows["8a"]["status"] == FAIL and "no GPU device, not exactly /dev/nvidia1" in rows["8a"]["details"]
    assert rows["8c"]["status"] == PASS
