"""What `gpufrac node-check` reads from a host (gpufrac.agent.edges.node_facts): a fake `containerd` on PATH, CDI specs
in a temporary directory (JSON and YAML, as NVIDIA's toolkit and device plugin write them), an NRI socket that
answers, the toolkit's config, a cgroup root, and real pynvml over the fake libnvidia-ml.so.1."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufrac.agent.decide.node_check import Author, Status, node_check
from gpufrac.agent.edges.node_facts import (
    Where,
    cgroup_version,
    gather,
    log_node_check,
    probe_socket,
    read_spec,
    toolkit_env_unprivileged,
)
from gpufrac.agent.programs.node_agent import node_check_where
from gpufrac.cli import build_parser
from gpufrac.core.annotations import ComputeMode
from testkit.agent import UUID_A, UUID_B

TOOLKIT_YAML = f"""---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    hooks:
    - hookName: createContainer
      path: /usr/bin/nvidia-cdi-hook
      args: [nvidia-cdi-hook, apply-cuda-memory-limits, --driver-root, /, --gpu-id, "0"]
- name: {UUID_A}
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]
"""


def fake_containerd(bin_dir: Path, version_line: str) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "containerd"
    path.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] || exit 3\necho '{version_line}'\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def nri_socket(tmp_path: Path) -> Iterator[Path]:
    """Something that accepts connections, as containerd's NRI socket does."""
    path = tmp_path / "nri.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(4)
        yield path


@pytest.fixture
def host(tmp_path: Path, fake_gpus: Any, mps_binary: str, nri_socket: Path) -> Where:
    fake_gpus.gpu(UUID_A).gpu(UUID_B)
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "nvidia.yaml").write_text(TOOLKIT_YAML)
    (cdi / "k8s.device-plugin.nvidia.com-gpu.json").write_text(json.dumps({
        "cdiVersion": "0.5.0", "kind": "k8s.device-plugin.nvidia.com/gpu",
        "devices": [{"name": UUID_B, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}}]}))
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "cgroup.controllers").write_text("cpu memory\n")
    toolkit = tmp_path / "config.toml"
    toolkit.write_text("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n[nvidia-container-cli]\n")
    return Where(modes=tuple(ComputeMode), nri_socket=nri_socket, cdi_dirs=(cdi, tmp_path / "absent"),
                 containerd=str(fake_containerd(tmp_path / "bin", "containerd github.com/containerd/containerd/v2 "
                                                                  "v2.4.2 2f1e7ab")),
                 mps_binary=mps_binary, mps_root=tmp_path / "mps", cgroup_root=cgroup, toolkit_config=toolkit)


def test_a_host_with_everything_is_read_as_it_is(host: Where) -> None:
    facts = gather(host)
    assert facts.runtime == "containerd github.com/containerd/containerd/v2 v2.4.2 2f1e7ab"
    assert facts.nri_answers and facts.nri_error == ""
    assert facts.inventory is not None and [g.uuid for g in facts.inventory.gpus] == [UUID_A, UUID_B]
    assert facts.inventory.driver_version == "615.20"
    assert facts.mps_binary == host.mps_binary and facts.mps_daemons == dict.fromkeys(ComputeMode, False)
    assert facts.cgroup_version == 2 and facts.toolkit_env_unprivileged is False
    specs = {Path(s.path).name: s for s in facts.cdi_specs}
    assert specs["nvidia.yaml"].author is Author.TOOLKIT and specs["nvidia.yaml"].memory_limit_hook
    assert set(specs["nvidia.yaml"].devices) == {"nvidia.com/gpu=0", f"nvidia.com/gpu={UUID_A}", "nvidia.com/gpu=all"}
    assert specs["k8s.device-plugin.nvidia.com-gpu.json"].author is Author.DEVICE_PLUGIN
    report = node_check(facts)
    assert report.ok, report.checks  # GPU 0 by the toolkit's spec, GPU 1 by the device plugin's
    assert {c.name: c.status for c in report.checks}["cdi coverage"] is Status.OK


def test_containerd_2_0_on_the_host_blocks_every_mode(host: Where, tmp_path: Path) -> None:
    old = fake_containerd(tmp_path / "old", "containerd github.com/containerd/containerd/v2 v2.0.5 abc")
    report = node_check(gather(Where(**{**host.__dict__, "containerd": str(old)})))
    assert not report.ok
    runtime = report.checks[0]
    assert (runtime.status, runtime.found) == (Status.FAIL, f"containerd 2.0.5 (from {old} --version): drops the "
                                                            "CDI devices NRI plugins inject")


def test_a_missing_piece_is_named_not_raised(tmp_path: Path, fake_gpus: Any) -> None:
    fake_gpus.set(error=9)  # NVML: driver not loaded
    where = Where(modes=(ComputeMode.SM_SHARING,), nri_socket=tmp_path / "none.sock", cdi_dirs=(tmp_path / "no",),
                  containerd=str(tmp_path / "no-containerd"), mps_binary=str(tmp_path / "no-mps"),
                  cgroup_root=tmp_path / "no-cgroup", toolkit_config=tmp_path / "no.toml")
    facts = gather(where)
    assert facts.runtime == "" and "not found" in facts.runtime_error
    assert (facts.nri_answers, facts.nri_error) == (False, "no socket there")
    assert facts.inventory is None and facts.nvml_error.startswith("NVML: ")
    assert (facts.mps_binary, facts.cgroup_version, facts.toolkit_env_unprivileged) == ("", None, None)
    assert facts.cdi_specs == ()
    report = node_check(facts)
    assert [m.enforceable for m in report.modes] == [False]


def test_a_stale_socket_that_refuses_is_told_apart(tmp_path: Path) -> None:
    path = tmp_path / "stale.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.close()  # the file stays, nobody listens: containerd stopped
    answers, why = probe_socket(path)
    assert not answers and why.startswith("refuses connections")


def test_an_unreadable_spec_says_why(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "nvidia.com/gpu"}')
    assert read_spec(bad).error == "a CDI spec needs a `devices` list"
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: [unclosed\n")
    assert read_spec(broken).error


def test_cgroup_v1_and_the_toolkits_default(tmp_path: Path) -> None:
    (tmp_path / "v1" / "memory").mkdir(parents=True)
    assert cgroup_version(tmp_path / "v1") == 1
    config = tmp_path / "config.toml"
    config.write_text("[nvidia-container-runtime]\nmode = \"cdi\"\n")
    assert toolkit_env_unprivileged(config) is True  # unset: the toolkit's default accepts the env var
    config.write_text("not toml = = \n")
    assert toolkit_env_unprivileged(config) is None


def test_the_agent_logs_the_check_at_start(host: Where, caplog: pytest.LogCaptureFixture) -> None:
    agent_view = Where(**{**host.__dict__, "containerd": ""})  # no runtime binary in the agent's container
    logger = logging.getLogger("test.node-check")
    with caplog.at_level(logging.INFO, logger="test.node-check"):
        assert log_node_check(agent_view, logger)
    messages = [r.getMessage() for r in caplog.records]
    assert "node check (gpufrac node-check): time-slicing: driver, sm-sharing: driver" in messages
    assert any(m.startswith("node check: runtime warn: unknown (not read at start; the NRI plugin logs it")
               for m in messages)


def test_the_agent_checks_what_its_own_flags_name(tmp_path: Path) -> None:
    args = build_parser("agent").parse_args([
        "agent", "--node", "n", "--modes", "sm-sharing", "--no-nri", "--nri-socket", str(tmp_path / "nri.sock"),
        "--cdi-spec-dir", str(tmp_path / "cdi"), "--mps-binary", "/opt/mps-control", "--mps-root", str(tmp_path)])
    where = node_check_where(args)
    assert (where.modes, where.nri_enabled, where.nri_socket, where.cdi_dirs) == (
        (ComputeMode.SM_SHARING,), False, tmp_path / "nri.sock", (tmp_path / "cdi",))
    assert (where.mps_binary, where.mps_root, where.containerd) == ("/opt/mps-control", tmp_path, "")
    assert node_check_where(build_parser("agent").parse_args(["agent", "--node", "n"])).cdi_dirs == (
        Path("/etc/cdi"), Path("/var/run/cdi"))
