"""The real node's harness hands the machine over safely: cleaning up after a node whose owner is gone must
never tear down the network, cgroups and mounts of another node that holds the machine's lock now. Its fake GPU
devices never shadow a driver's and go on cleanup; its CDI specs have NVIDIA's shape; containerd 2's
configuration turns NRI and CDI on in the node's own paths."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from e2e import machine, node
from e2e.toolkit import gpu_devices
from e2e.toolkit.containerd import Containerd
from e2e.toolkit.errors import ClusterError
from e2e.toolkit.netns import NodeNetwork
from e2e.toolkit.procs import spawn


@pytest.fixture
def lock_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "real-node.lock"
    monkeypatch.setattr(machine, "LOCK_FILE", str(path))
    return path


@pytest.fixture
def cleaned(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []
    monkeypatch.setattr(machine, "clean_machine", lambda workdir, state, quiet=False: calls.append(workdir))
    return calls


def hold(lock_file: Path) -> subprocess.Popen[bytes]:
    """Another node: a process holding the machine's lock."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(lock_file)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)\n")],
        stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
    return holder


def test_an_orphan_on_a_free_machine_is_cleaned_under_the_lock(tmp_path, lock_file, monkeypatch):
    assert machine.machine_is_free()
    free_while_cleaning: list[bool] = []
    monkeypatch.setattr(machine, "clean_machine",
                        lambda workdir, state, quiet=False: free_while_cleaning.append(machine.machine_is_free()))
    machine.clean_orphan(tmp_path, {"lock": None})
    assert free_while_cleaning == [False]  # cleaned once, holding the machine's lock
    assert machine.machine_is_free()  # and released afterwards


def test_an_orphan_leaves_the_machine_alone_while_another_node_holds_it(tmp_path, lock_file, cleaned, capsys):
    holder = hold(lock_file)
    try:
        assert not machine.machine_is_free()
        machine.clean_orphan(tmp_path, {"lock": None})
    finally:
        holder.kill()
        holder.wait()
    assert cleaned == []
    assert "another real node holds" in capsys.readouterr().out


def test_an_orphan_whose_own_lock_holder_still_runs_is_cleaned(tmp_path, lock_file, cleaned):
    # The orphan's `sleep infinity` lock child outlived its owner: the machine is still the orphan's.
    sleeper = spawn("node-lock", ["sleep", "60"], tmp_path / "node-lock.log")
    try:
        machine.clean_orphan(tmp_path, {"lock": sleeper.to_json()})
    finally:
        sleeper.stop()
    assert cleaned == [tmp_path]


# ---- the fake GPU devices and their CDI specs -----------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")


@needs_root
def test_fake_devices_are_made_and_only_they_are_removed(tmp_path):
    made = gpu_devices.create(2, tmp_path)
    assert sorted(made) == sorted(str(tmp_path / n) for n in
                                  ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"))
    st = os.stat(tmp_path / "nvidia1")
    assert stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == 1 and os.minor(st.st_rdev) == 3
    assert stat.S_IMODE(st.st_mode) == 0o666
    assert gpu_devices.create(2, tmp_path) == made  # again: the same, no error
    os.mknod(tmp_path / "nvidia-modeset", 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # not ours
    (tmp_path / "nvidia-notes").write_text("not a device")
    assert sorted(gpu_devices.remove(tmp_path)) == sorted(made)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nvidia-modeset", "nvidia-notes"]


@needs_root
def test_fake_devices_never_shadow_a_drivers_device(tmp_path):
    os.mknod(tmp_path / "nvidia0", 0o600 | stat.S_IFCHR, os.makedev(195, 0))  # what NVIDIA's driver makes
    with pytest.raises(ClusterError, match=r"nvidia0 exist and are not the harness's fake devices"):
        gpu_devices.create(1, tmp_path)
    assert not (tmp_path / "nvidiactl").exists()
    assert gpu_devices.remove(tmp_path) == []
    assert os.major(os.stat(tmp_path / "nvidia0").st_rdev) == 195


def test_cdi_specs_name_each_gpu_by_index_and_uuid_as_nvidias_tools_do(tmp_path):
    uuids = node.GPU_UUIDS[:2]
    written = gpu_devices.write_cdi_specs(tmp_path, uuids)
    specs = {json.loads(p.read_text())["kind"]: json.loads(p.read_text()) for p in written}
    toolkit, plugin = specs["nvidia.com/gpu"], specs["k8s.device-plugin.nvidia.com/gpu"]

    def nodes(edits: dict) -> list[str]:
        return [n["path"] for n in edits["deviceNodes"]]

    by_name = {d["name"]: d["containerEdits"] for d in toolkit["devices"]}
    assert list(by_name) == ["0", uuids[0], "1", uuids[1], "all"]
    assert nodes(by_name["1"]) == nodes(by_name[uuids[1]]) == ["/dev/nvidia1"]
    assert nodes(by_name["all"]) == ["/dev/nvidia0", "/dev/nvidia1"]
    assert {d["name"]: nodes(d["containerEdits"]) for d in plugin["devices"]} == {
        uuids[0]: ["/dev/nvidia0"], uuids[1]: ["/dev/nvidia1"]}
    for spec in (toolkit, plugin):
        assert spec["cdiVersion"] == "0.5.0"
        assert nodes(spec["containerEdits"]) == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


# ---- containerd's configuration -------------------------------------------------------------------------------


@pytest.fixture
def containerd_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tools cache whose runtime binaries are placeholders: only their paths go into the configuration."""
    (tmp_path / "tools" / "bin").mkdir(parents=True)
    for name in ("containerd", "containerd-shim-runc-v2", "ctr", "runc"):
        exe = tmp_path / "tools" / "bin" / name
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    monkeypatch.setenv("GPUFRAC_TOOLS_CACHE", str(tmp_path / "tools"))
    return tmp_path / "tools" / "bin"


@pytest.mark.parametrize("nri", [True, False])
def test_containerd_2_config_turns_on_nri_and_cdi_in_the_nodes_own_paths(tmp_path, containerd_tools, nri):
    runtime = Containerd(tmp_path / "containerd", "localhost/pause:1", NodeNetwork(), nri=nri)
    runtime.write_config()
    cfg = tomllib.loads(runtime.config_file.read_text())
    assert cfg["version"] == 3
    plugins = cfg["plugins"]
    assert plugins["io.containerd.nri.v1.nri"] == {"disable": not nri, "socket_path": str(runtime.nri_socket)}
    cri = plugins["io.containerd.cri.v1.runtime"]
    assert cri["cdi_spec_dirs"] == [str(runtime.cdi_dir)] and runtime.cdi_dir.is_dir()
    assert cri["restrict_oom_score_adj"] is True and cri["netns_mounts_under_state_dir"] is True
    runc = cri["containerd"]["runtimes"]["runc"]["options"]
    assert runc == {"SystemdCgroup": False, "BinaryName": str(containerd_tools / "runc"),
                    "Root": str(tmp_path / "containerd" / "run" / "runc")}
    assert plugins["io.containerd.cri.v1.images"]["pinned_images"] == {"sandbox": "localhost/pause:1"}
    for path in (cfg["root"], cfg["state"], cfg["grpc"]["address"], str(runtime.nri_socket)):
        assert path.startswith(str(tmp_path / "containerd")), path
    assert runtime.env()["PATH"].split(os.pathsep)[0] == str(containerd_tools)


def test_containerd_nri_validator_requires_the_named_plugins(tmp_path, containerd_tools):
    runtime = Containerd(tmp_path / "containerd", "localhost/pause:1", NodeNetwork(),
                         nri_required_plugins=("gpufrac",), nri_tolerate_annotation="gpufrac.io/tolerate-missing")
    runtime.write_config()
    nri = tomllib.loads(runtime.config_file.read_text())["plugins"]["io.containerd.nri.v1.nri"]
    assert nri["default_validator"] == {"enable": True, "required_plugins": ["gpufrac"],
                                        "tolerate_missing_plugins_annotation": "gpufrac.io/tolerate-missing"}


def test_a_shims_socket_is_found_from_its_process(tmp_path, monkeypatch):
    """A SIGKILLed shim leaves its socket in containerd's machine-wide directory: cleanup finds it from the
    shim's open sockets before killing it."""
    monkeypatch.setattr(machine, "SHIM_SOCKET_DIR", str(tmp_path / "s"))
    (tmp_path / "s").mkdir()
    sock, other = tmp_path / "s" / "0123abcd", tmp_path / "elsewhere.sock"
    listener = subprocess.Popen([sys.executable, "-c", (
        "import socket, sys, time\n"
        "for path in sys.argv[1:]:\n"
        "    s = socket.socket(socket.AF_UNIX); s.bind(path); s.listen(); globals()[path] = s\n"
        "print('listening', flush=True)\ntime.sleep(60)\n"), str(sock), str(other)], stdout=subprocess.PIPE)
    try:
        assert listener.stdout is not None and listener.stdout.readline() == b"listening\n"
        assert machine._shim_sockets(listener.pid) == [str(sock)]
    finally:
        listener.kill()
        listener.wait()
    assert sock.exists()  # what a killed shim leaves behind
