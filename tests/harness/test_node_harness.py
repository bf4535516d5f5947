"""The real node's harness hands the machine over safely: cleaning up after a node whose owner is gone must
never tear down the network, cgroups and mounts of another node that holds the machine's lock now. Its fake GPU
devices carry NVIDIA's numbers, never shadow a driver's and go on cleanup; its CDI spec is the one `nvidia-ctk cdi
generate` writes against the fakes; containerd 2's configuration turns NRI and CDI on in the node's own paths, and
`nvidia-ctk runtime configure` adds NVIDIA's runtime handler beside runc."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from e2e import machine, node
from e2e.toolkit import gpu_devices, nvidia_toolkit
from e2e.toolkit.containerd import Containerd
from e2e.toolkit.errors import ClusterError
from e2e.toolkit.netns import NodeNetwork
from e2e.toolkit.procs import spawn
from e2e.toolkit.tools import find_binary


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


@pytest.fixture
def no_driver(tmp_path: Path) -> Path:
    """A /proc of a machine without an NVIDIA driver (the real one may have one)."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "devices").write_text("Character devices:\n  1 mem\n245 hidraw\n\nBlock devices:\n195 notchar\n")
    return proc


@needs_root
def test_fake_devices_carry_nvidias_numbers_and_only_they_are_removed(tmp_path, no_driver):
    dev = tmp_path / "dev"
    dev.mkdir()
    made = gpu_devices.create(2, dev, no_driver)
    assert sorted(made) == sorted(str(dev / n) for n in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-modeset",
                                                          "nvidia-uvm", "nvidia-uvm-tools"))
    numbers = {p.name: (os.major(p.stat().st_rdev), os.minor(p.stat().st_rdev)) for p in dev.iterdir()}
    assert numbers == {"nvidia0": (195, 0), "nvidia1": (195, 1), "nvidiactl": (195, 255),
                       "nvidia-modeset": (195, 254), "nvidia-uvm": (gpu_devices.UVM_MAJOR, 0),
                       "nvidia-uvm-tools": (gpu_devices.UVM_MAJOR, 1)}
    st = os.stat(dev / "nvidia1")
    assert stat.S_ISCHR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666
    assert gpu_devices.create(2, dev, no_driver) == made  # again: the same, no error
    os.mknod(dev / "nvidia-nvswitchctl", 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # not ours
    os.mknod(dev / "nvidia7", 0o600 | stat.S_IFCHR, os.makedev(195, 3))  # not our numbers for that name
    (dev / "nvidia-notes").write_text("not a device")
    assert sorted(gpu_devices.remove(dev, no_driver)) == sorted(made)
    assert sorted(p.name for p in dev.iterdir()) == ["nvidia-notes", "nvidia-nvswitchctl", "nvidia7"]


@needs_root
def test_fake_devices_are_never_made_or_removed_beside_a_driver(tmp_path, no_driver):
    dev = tmp_path / "dev"
    dev.mkdir()
    os.mknod(dev / "nvidia0", 0o600 | stat.S_IFCHR, os.makedev(195, 3))  # a node of other numbers
    with pytest.raises(ClusterError, match=r"nvidia0 exist and are not the harness's fake devices"):
        gpu_devices.create(1, dev, no_driver)
    assert not (dev / "nvidiactl").exists()
    (dev / "nvidia0").unlink()
    gpu_devices.create(1, dev, no_driver)
    loaded = tmp_path / "loaded"
    (loaded / "driver" / "nvidia").mkdir(parents=True)  # what a loaded driver shows
    (loaded / "devices").write_text("Character devices:\n195 nvidia\n510 nvidia-uvm\n")
    with pytest.raises(ClusterError, match=r"has an NVIDIA driver .*driver/nvidia exists; .*'nvidia' at major 195"):
        gpu_devices.create(1, dev, loaded)
    assert gpu_devices.remove(dev, loaded) == []  # with a driver loaded, 195:0 may be a real GPU
    assert (dev / "nvidia0").exists()
    (no_driver / "devices").write_text(f"Character devices:\n{gpu_devices.UVM_MAJOR} some-driver\n")
    with pytest.raises(ClusterError, match=r"drivers at the fake GPUs' majors"):
        gpu_devices.create(1, dev, no_driver)


def test_the_probe_reads_granted_and_denied_devices():
    out = "DEV nvidia1 c3:1 ENXIO\nDEV nvidiactl c3:ff EPERM\nunrelated line\n"
    assert gpu_devices.parse_probe(out) == {"nvidia1": ("195:1", "ENXIO"), "nvidiactl": ("195:255", "EPERM")}


NVIDIA_BINARIES = {n: find_binary(n) for n in nvidia_toolkit.TOOLKIT_BINARIES}  # before a test moves the cache
needs_nvidia = pytest.mark.skipif(None in NVIDIA_BINARIES.values(),
                                  reason="needs NVIDIA's container toolkit (bash e2e/build-nvidia.sh)")


@needs_root
@needs_nvidia
def test_the_cdi_spec_is_nvidia_ctks_against_the_fakes(tmp_path):
    """No hand-written spec: nvidia-ctk, against the fake NVML and driver root, names each GPU by index and UUID with
    its device node's numbers, and gives every device the control devices, the driver's libraries and its hooks."""
    from testkit.fakes import driver_root
    from testkit.fakes.state import FakeGpuState

    state = FakeGpuState(tmp_path / "nvml.json")
    for uuid in node.GPU_UUIDS[:2]:
        state.gpu(uuid)
    driver = driver_root.build(tmp_path / "driver", tmp_path / "nvml.json")
    toolkit = nvidia_toolkit.NvidiaToolkit(tmp_path / "toolkit", driver.path,
                                           {"GPUFRAC_FAKE_NVML": str(tmp_path / "nvml.json")}, dev_root=driver.path)
    spec = yaml.safe_load(toolkit.generate_cdi_spec(tmp_path / "cdi" / "nvidia.yaml").read_text())
    uuids = node.GPU_UUIDS[:2]
    by_name = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    assert spec["kind"] == "nvidia.com/gpu" and set(by_name) == {"0", "1", *uuids, "all"}
    gpu1 = by_name["1"]["deviceNodes"]
    assert gpu1 == by_name[uuids[1]]["deviceNodes"]
    assert [(n["path"], n["hostPath"], n["major"], n["minor"]) for n in gpu1] == [
        ("/dev/nvidia1", str(driver.path / "dev" / "nvidia1"), 195, 1)]
    common = spec["containerEdits"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in common["env"]
    assert {n["path"] for n in common["deviceNodes"]} == {f"/dev/{c}" for c in gpu_devices.CONTROL_DEVICES}
    assert str(driver.library("libcuda")) in {m["hostPath"] for m in common["mounts"]}
    assert {h["args"][1] for h in common["hooks"]} >= {"create-symlinks", "update-ldcache"}


@needs_nvidia
def test_nvidia_ctk_adds_the_nvidia_handler_beside_runc_and_the_hardened_setting_flips(tmp_path, containerd_tools):
    for name, path in NVIDIA_BINARIES.items():
        (containerd_tools / name).symlink_to(str(path))
    runtime = Containerd(tmp_path / "containerd", "localhost/pause:1", NodeNetwork())
    runtime.write_config()
    toolkit = nvidia_toolkit.NvidiaToolkit(tmp_path / "toolkit", tmp_path / "driver", {})
    drop_in = toolkit.configure_containerd(runtime.config_file)
    top = tomllib.loads(runtime.config_file.read_text())
    assert str(drop_in.parent / "*.toml") in top["imports"]
    cri = tomllib.loads(drop_in.read_text())["plugins"]["io.containerd.cri.v1.runtime"]
    assert cri["containerd"]["default_runtime_name"] == "runc"
    handler = cri["containerd"]["runtimes"][nvidia_toolkit.RUNTIME_HANDLER]
    assert handler["options"]["BinaryName"] == find_binary("nvidia-container-runtime")
    assert handler["options"]["Root"] == cri["containerd"]["runtimes"]["runc"]["options"]["Root"]
    assert cri["enable_cdi"] is True and cri["cdi_spec_dirs"] == [str(runtime.cdi_dir)]
    config = tomllib.loads(toolkit.write_config([runtime.cdi_dir], str(containerd_tools / "runc")).read_text())
    assert config[nvidia_toolkit.HARDENED_KEY] is True and not toolkit.hardened()
    assert config["nvidia-container-runtime"]["runtimes"] == [str(containerd_tools / "runc")]
    assert config["nvidia-container-runtime"]["modes"]["cdi"]["spec-dirs"] == [str(runtime.cdi_dir)]
    toolkit.set_hardened(True)
    assert tomllib.loads(toolkit.config_file.read_text())[nvidia_toolkit.HARDENED_KEY] is False and toolkit.hardened()


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
