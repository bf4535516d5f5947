"""gpucheck's runtime rows (8a-8c) for real: containerd 2 from the tools cache with its CRI, NRI and CDI on, the
agent's NRI plugin (its own code: NriPlugin, the wire session, decide), fake GPU device nodes (c 1:3, in this test's
own directory) named by CDI specs of NVIDIA's shape, and crictl making the pods as it does on a GPU node. No kubelet
(it removes pods it did not make) and no NVIDIA runtime, so an env var gives nothing: what a container sees under
/dev is what the plugin, through containerd's CDI, handed it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.node import APP_IMAGE, GPU_UUIDS, IMAGES_DIR, PAUSE_IMAGE
from e2e.toolkit.cri_node import CriNode
from e2e.toolkit.tools import find_binary
from e2e.toolkit.wait import wait_until
from gpucheck.rows import FAIL, PASS, SKIPPED
from gpufrac.agent.decide.model import GpuInfo
from gpufrac.agent.decide.nri_decision import ContainerInfo, Injection, NodeFacts, PodInfo, Refusal
from gpufrac.agent.edges.nri.config import NriConfig
from gpufrac.agent.edges.nri.devices import CdiSpecs
from gpufrac.agent.edges.nri.plugin import NriPlugin, PluginState
from gpufrac.core.annotations import ComputeMode
from testkit.fakes.build import MPS_CONTROL, fake_nvml_library

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
FAKE_NODE = ROOT / "testkit" / "fakes" / "gpu_check_node.json"


def crictl() -> str | None:
    return os.environ.get("GPUFRAC_CRICTL") or find_binary("crictl") or shutil.which("crictl")


class Sink:
    def __init__(self) -> None:
        self.states: list[PluginState] = []
        self.outcomes: list[tuple[str, str]] = []  # (container, outcome)

    def decided(self, pod: PodInfo, container: ContainerInfo, result: Injection | Refusal) -> None:
        self.outcomes.append((container.name, str(result.outcome)))

    def state_changed(self, state: PluginState) -> None:
        self.states.append(state)


@pytest.fixture
def node() -> Iterator[CriNode]:
    missing = [name for name in ("containerd", "containerd-shim-runc-v2", "ctr", "runc") if not find_binary(name)]
    if os.geteuid() != 0 or missing:
        pytest.skip(f"needs root and the tools cache's containerd 2 and runc (`make tools`); missing {missing}")
    if crictl() is None:
        pytest.skip("needs crictl (`make tools`, or GPUFRAC_CRICTL)")
    if any(not (IMAGES_DIR / a).is_file() for a in ("pause.oci.tar", "app.oci.tar")):
        pytest.skip("needs the local images (`make image`)")
    # a short path: a unix socket's path must stay under 108 bytes
    root = Path(f"/tmp/gpufrac-gc-{os.getpid()}-{time.monotonic_ns() % 100000}")
    node = CriNode(root, PAUSE_IMAGE, GPU_UUIDS)
    try:
        node.start(IMAGES_DIR)
        yield node
    finally:
        node.stop(crictl())
        subprocess.run(["rm", "-rf", str(root)], check=False)


@pytest.fixture
def plugin(node: CriNode) -> Iterator[Sink]:
    """The agent's NRI plugin registered with the node's containerd, deciding with the node's CDI specs."""
    gpus = tuple(GpuInfo(i, u, "NVIDIA H200", 143771 << 20) for i, u in enumerate(GPU_UUIDS))
    cdi = CdiSpecs([node.cdi_dir])
    sink = Sink()
    instance = NriPlugin(NriConfig(node.nri_socket, name="gpucheck-test", lock_file=None),
                         lambda: NodeFacts(gpus, cdi.names(), {}, dict.fromkeys(ComputeMode)), sink)
    stop = threading.Event()
    thread = threading.Thread(target=instance.run, args=(stop,), daemon=True)
    thread.start()
    wait_until(lambda: PluginState.REGISTERED in sink.states, 60, "the plugin registered", interval=0.1)
    yield sink
    stop.set()
    instance.stop()
    thread.join(10)


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
