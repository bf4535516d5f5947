"""`gpufrac node-check` as a person runs it on a node: the table, --json, the exit code, one-line errors. The node is
faked at its edges only: the fake libnvidia-ml.so.1 (on LD_LIBRARY_PATH, read by the real pynvml), a `containerd`
that prints a version, CDI specs and an NRI socket in a temporary directory; and the real containerd where the
tools build made it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.toolkit.containerd import daemon_config
from e2e.toolkit.errors import ToolsMissingError
from e2e.toolkit.nvidia_toolkit import NvidiaToolkit, nvidia_binaries
from e2e.toolkit.tools import find_binary
from e2e.toolkit.wait import wait_until
from testkit.agent import UUID_A, UUID_B
from testkit.fakes import driver_root
from testkit.fakes.build import MPS_CONTROL, fake_nvml_dir
from testkit.fakes.state import FakeGpuState

ROOT = Path(__file__).resolve().parents[2]


class Node:
    """A temporary node: its NVML state, bin directory, CDI specs, NRI socket, cgroup root and toolkit config."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.gpus = FakeGpuState(tmp / "nvml.json").gpu(UUID_A).gpu(UUID_B)
        self.bin = tmp / "bin"
        self.bin.mkdir()
        (self.bin / "nvidia-cuda-mps-control").symlink_to(MPS_CONTROL)
        self.containerd("containerd github.com/containerd/containerd/v2 v2.4.2 2f1e7ab")
        self.cdi = tmp / "cdi"
        self.cdi.mkdir()
        self.spec((0, UUID_A), (1, UUID_B))
        (tmp / "cgroup").mkdir()
        (tmp / "cgroup" / "cgroup.controllers").write_text("cpu memory\n")
        (tmp / "config.toml").write_text("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n")
        self.nri = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.nri.bind(str(tmp / "nri.sock"))
        self.nri.listen(4)

    def containerd(self, version_line: str) -> None:
        path = self.bin / "containerd"
        path.write_text(f"#!/bin/sh\necho '{version_line}'\n")
        path.chmod(0o755)

    def spec(self, *gpus: tuple[int, str]) -> None:
        devices = [{"name": name, "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{index}"}]}}
                   for index, uuid in gpus for name in (str(index), uuid)]
        (self.cdi / "nvidia.json").write_text(json.dumps({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
                                                          "devices": devices}))

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {"PATH": f"{self.bin}:/usr/bin:/bin", "LD_LIBRARY_PATH": str(fake_nvml_dir()),
               "GPUFRAC_FAKE_NVML": str(self.gpus.path), "HOME": str(self.tmp)}
        flags = ["--cdi-spec-dir", str(self.cdi), "--nri-socket", str(self.tmp / "nri.sock"),
                 "--cgroup-root", str(self.tmp / "cgroup"), "--toolkit-config", str(self.tmp / "config.toml"),
                 "--mps-root", str(self.tmp / "mps")]
        return subprocess.run([sys.executable, "-m", "gpufrac", "node-check", *flags, *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    made = Node(tmp_path)
    yield made
    made.nri.close()


def test_a_node_that_enforces_everything_exits_0(node: Node) -> None:
    result = node.run()
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].split()[:3] == ["time-slicing", "yes", "driver"]
    assert lines[2].split()[:3] == ["sm-sharing", "yes", "driver"]
    assert "containerd 2.4.2 (from containerd --version)" in result.stdout
    assert f"{node.tmp / 'nri.sock'} answers" in result.stdout
    assert "615.20 (CUDA 13.4), 2 GPU(s)" in result.stdout
    assert lines[-1] == "every enabled mode is enforceable"
    assert result.stderr == ""


def test_json_carries_the_verdicts(node: Node) -> None:
    result = node.run("--json")
    data = json.loads(result.stdout)
    assert result.returncode == 0 and data["ok"] is True
    assert [(m["mode"], m["enforcement"]) for m in data["modes"]] == [("time-slicing", "driver"),
                                                                     ("sm-sharing", "driver")]
    assert {c["name"]: c["status"] for c in data["checks"]}["cdi coverage"] == "ok"


def test_a_580_driver_fails_time_slicing_only_and_says_what_to_do(node: Node) -> None:
    node.gpus.set(driver_version="580.95.05", cuda_driver_version=13000)
    result = node.run()
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[1].split()[:3] == ["time-slicing", "NO", "none"]
    assert lines[2].split()[:3] == ["sm-sharing", "yes", "mps"]
    assert "-> upgrade to r615+ for time-slicing, or serve sm-sharing only (agent.modes)" in result.stdout
    assert node.run("--modes", "sm-sharing").returncode == 0  # what the node can do, asked alone


@pytest.mark.parametrize(("change", "words"), [
    ("containerd-2.0", "containerd 2.0.5 (from containerd --version): drops the CDI devices NRI plugins inject"),
    ("no-cdi-spec", f"no CDI device names GPU(s) 1 ({UUID_B}): fractions there would get bare device nodes"),
])
def test_a_delivery_path_that_cannot_work_exits_1(node: Node, change: str, words: str) -> None:
    if change == "containerd-2.0":
        node.containerd("containerd github.com/containerd/containerd/v2 v2.0.5 abc")
    else:
        node.spec((0, UUID_A))
    result = node.run()
    assert result.returncode == 1
    assert words in result.stdout
    assert ("upgrade containerd to 2.1" if change == "containerd-2.0" else "nvidia-ctk cdi generate") in result.stdout


def test_bad_input_is_a_one_line_error(node: Node) -> None:
    result = node.run("--modes", "everything")
    assert result.returncode == 2
    assert "--modes: 'everything': expected a comma list of time-slicing, sm-sharing" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_real_containerd_is_read() -> None:
    binary = find_binary("containerd") or find_binary("containerd-v2.4.2")
    if binary is None:
        pytest.skip("containerd is not built yet (make tools)")
    result = subprocess.run([sys.executable, "-m", "gpufrac", "node-check", "--json", "--containerd", binary,
                             "--mps-binary", "/nonexistent"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PATH": "/usr/bin:/bin"})
    runtime = json.loads(result.stdout)["checks"][0]
    assert runtime["status"] == "ok"
    assert runtime["found"].startswith("containerd 2.4.2 (from ")


@pytest.mark.e2e
def test_a_real_containerd_is_read_through_its_cri_socket_and_its_nri_socket_answers() -> None:
    """containerd 2.4.2 of the tools cache on sockets of this test's own: node-check asks its CRI Version through
    crictl and connects to its NRI socket; once it stops, both say so."""
    binary, crictl = find_binary("containerd"), find_binary("crictl")
    if binary is None or crictl is None or os.geteuid() != 0:
        pytest.skip("needs root, containerd 2 and crictl in the tools cache (`make tools`)")
    root = Path(f"/tmp/gpufrac-nc-{os.getpid()}")  # short: a unix socket's path must stay under 108 bytes
    nri, cri = root / "nri" / "nri.sock", root / "run" / "containerd.sock"
    root.mkdir()
    (root / "config.toml").write_text(f"""{daemon_config(root, cri)}
[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = '{nri}'
""")
    daemon = subprocess.Popen([binary, "--config", str(root / "config.toml")], stdout=subprocess.DEVNULL,
                              stderr=(root / "containerd.log").open("wb"))
    try:
        wait_until(lambda: nri.is_socket() and cri.is_socket(), 60, "containerd's sockets", interval=0.1)

        def check() -> dict[str, Any]:
            result = subprocess.run([sys.executable, "-m", "gpufrac", "node-check", "--json", "--cri-socket",
                                     str(cri), "--crictl", crictl, "--nri-socket", str(nri)], cwd=ROOT,
                                    capture_output=True, text=True, timeout=60)
            return {c["name"]: c for c in json.loads(result.stdout)["checks"]}

        running = check()
        assert running["runtime"]["status"] == "ok"
        assert running["runtime"]["found"] == f"containerd 2.4.2 (from CRI Version at {cri})"
        assert (running["nri"]["status"], running["nri"]["found"]) == ("ok", f"{nri} answers")
        assert daemon.poll() is None  # the probe's connection did not hurt it
        daemon.terminate()
        daemon.wait(30)
        stopped = check()
        assert stopped["runtime"]["status"] == "warn" and "exited" in stopped["runtime"]["found"]
        assert stopped["nri"]["status"] == "warn"
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)
        subprocess.run(["rm", "-rf", str(root)], check=False)


@pytest.mark.e2e
def test_a_spec_and_config_nvidias_toolkit_wrote_are_read_as_its_own(tmp_path: Path) -> None:
    """`nvidia-ctk cdi generate` (v1.20.2, the tools cache's) against the fake NVML and driver root, and the
    config.toml `nvidia-ctk config` writes in the hardened setting: node-check names nvidia-ctk as the spec's author,
    finds its memory-limit hook (and its absence where NVIDIA's --disable-hook left it out), covers every GPU."""
    try:
        binaries = nvidia_binaries()
    except ToolsMissingError as err:
        pytest.skip(str(err))
    if os.geteuid() != 0:
        pytest.skip("the fake driver root's device nodes need root (mknod)")
    node = Node(tmp_path)
    driver = driver_root.build(tmp_path / "driver", node.gpus.path)
    toolkit = NvidiaToolkit(tmp_path / "toolkit", driver.path, {"GPUFRAC_FAKE_NVML": str(node.gpus.path)},
                            dev_root=driver.path)
    (node.cdi / "nvidia.json").unlink()
    toolkit.generate_cdi_spec(node.cdi / "nvidia.yaml")
    toolkit.write_config([node.cdi], binaries["nvidia-ctk"], hardened=True)
    result = node.run("--json", "--toolkit-config", str(toolkit.config_file))
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert result.returncode == 0, result.stdout
    spec = checks["cdi spec"]["found"]
    assert "kind nvidia.com/gpu" in spec and "written by nvidia-ctk" in spec
    assert checks["cdi coverage"]["status"] == "ok"
    assert checks["toolkit"]["found"].endswith("= false (hardened)")
    assert "apply-cuda-memory-limits in" in checks["toolkit memory-limit hook"]["found"]

    toolkit.generate_cdi_spec(node.cdi / "nvidia.yaml", "--disable-hook=apply-cuda-memory-limits")
    checks = {c["name"]: c for c in json.loads(node.run("--json").stdout)["checks"]}
    assert checks["toolkit memory-limit hook"]["found"].startswith("no CDI spec runs apply-cuda-memory-limits")
