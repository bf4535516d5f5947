"""Issue 43: the GPU fakes follow NVIDIA's documents and measurements (reference/nvidia-stack.md), not gpufrac.

Each test pins one behaviour of the fake daemon (testkit/fakes/nvidia-cuda-mps-control) or the fake NVML
(testkit/fakes/fake_nvml.c) that gpufrac's enforcement rests on; each names the NVIDIA source in the fake."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from gpufrac.agent.edges.mps_control import MpsControlError, invoke
from gpufrac.agent.edges.supervisor import MpsSupervisor
from testkit.agent import UUID_A, UUID_B
from testkit.fakes.build import fake_nvml_dir
from testkit.fakes.mps_client import EXCLUSIVE_PROCESS, ClientLimits, attached, connect, connect_without_pipe
from testkit.fakes.state import FakeGpuState

PINNED = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
SERVER = "--server=gpufrac"


# ---- the MPS v3 daemon ----

def test_a_named_server_has_its_control_socket_and_a_default_namespace_that_gives_the_whole_gpu(
        daemon: MpsSupervisor) -> None:
    pipe, binary = daemon.spec.pipe_dir, daemon.spec.argv[0]
    assert (pipe / "gpufrac" / "control").is_socket()
    default = pipe / "gpufrac" / "default"
    assert (default / "control").is_socket()
    assert connect(default, UUID_A, env={}) == ClientLimits(None, 100)  # no limits anywhere: the whole GPU
    invoke(binary, pipe, ("server", "set", SERVER, "--pinned-memory-limit=10240M", "--active-thread-percentage=50"))
    assert connect(default, UUID_A, env={}) == ClientLimits(10240, 50)  # `server set` holds its namespaces


def test_an_env_naming_an_invisible_gpu_drops_the_namespaces_and_the_servers_limits(daemon: MpsSupervisor) -> None:
    """NVIDIA's measurement (615.71.09): `0=2G,1=4G` in a process seeing one GPU, under a 10G server limit,
    allocated 96,768 MiB. The thread cap survives."""
    pipe, binary = daemon.spec.pipe_dir, daemon.spec.argv[0]
    invoke(binary, pipe, ("server", "set", SERVER, "--pinned-memory-limit=10240M"))
    invoke(binary, pipe, ("namespace", "create", "ns1", SERVER))
    invoke(binary, pipe, ("namespace", "set", "ns1", SERVER, "--pinned-memory-limit=5120M",
                          "--active-thread-percentage=25"))
    ns = pipe / "gpufrac" / "ns1"
    assert connect(ns, UUID_A, env={PINNED: "0=2048M"}) == ClientLimits(2048, 25)  # well formed: lowers
    assert connect(ns, UUID_A, env={PINNED: f"{UUID_A}=2048M"}) == ClientLimits(2048, 25)
    assert connect(ns, UUID_A, env={PINNED: "0=2048M,1=4096M"}) == ClientLimits(None, 25)
    assert connect(ns, UUID_A, env={PINNED: "GPU-00000000-bogus=2048M"}) == ClientLimits(None, 25)
    assert connect(ns, UUID_A, visible=(UUID_A, UUID_B), env={PINNED: "0=2048M,1=4096M"}).pinned_mib == 2048


def test_namespace_delete_and_set_are_refused_with_clients_attached_and_force_deletes(
        daemon: MpsSupervisor) -> None:
    """NVIDIA's MPS v3 Namespaces page: `namespace delete` fails while clients are attached unless `--force`; KAI
    observed `namespace set` failing with clients attached on 615."""
    pipe, binary = daemon.spec.pipe_dir, daemon.spec.argv[0]
    invoke(binary, pipe, ("namespace", "create", "ns1", SERVER))
    ns = pipe / "gpufrac" / "ns1"
    with attached(ns):
        with pytest.raises(MpsControlError, match="client\\(s\\) attached"):
            invoke(binary, pipe, ("namespace", "set", "ns1", SERVER, "--pinned-memory-limit=4096M"))
        with pytest.raises(MpsControlError, match="use --force"):
            invoke(binary, pipe, ("namespace", "delete", "ns1", SERVER))
        assert ns.exists()
        invoke(binary, pipe, ("namespace", "delete", "ns1", SERVER, "--force"))
        assert not ns.exists()
    invoke(binary, pipe, ("namespace", "create", "ns2", SERVER))
    with attached(pipe / "gpufrac" / "ns2"):
        pass  # the client exits: nothing attached
    invoke(binary, pipe, ("namespace", "set", "ns2", SERVER, "--pinned-memory-limit=4096M"))
    invoke(binary, pipe, ("namespace", "delete", "ns2", SERVER))


# ---- the fake NVML: compute mode and the driver's cgroup limit ----

def test_a_process_without_its_pipe_directory_gets_the_whole_gpu_unless_exclusive_process(
        fake_gpus: FakeGpuState) -> None:
    fake_gpus.gpu(UUID_A)
    assert connect_without_pipe(UUID_A) == ClientLimits(None, 100)  # DEFAULT: an ordinary CUDA process
    pynvml.nvmlInit()
    try:
        pynvml.nvmlDeviceSetComputeMode(pynvml.nvmlDeviceGetHandleByUUID(UUID_A), EXCLUSIVE_PROCESS)
    finally:
        pynvml.nvmlShutdown()
    assert connect_without_pipe(UUID_A) is None  # the MPS server holds the GPU's one context
    assert fake_gpus.compute_mode(UUID_A) == EXCLUSIVE_PROCESS


class _Get(ctypes.Structure):
    _fields_ = [("nameSpace", ctypes.c_char_p), ("softLimit", ctypes.c_ulonglong), ("hardLimit", ctypes.c_ulonglong),
                ("currentUsed", ctypes.c_ulonglong)]


def _set_limit(cgroup: str, mib: int) -> int:
    """nvmlDeviceSetMemoryLimits_v1 on GPU A for `cgroup`, in a process of its own; its NVML return code."""
    code = ("import ctypes, pynvml, sys\n"
            "class _Set(ctypes.Structure):\n"
            "    _fields_ = [('nameSpace', ctypes.c_char_p), ('softLimit', ctypes.c_ulonglong),\n"
            "                ('hardLimit', ctypes.c_ulonglong)]\n"
            "pynvml.nvmlInit()\n"
            "lib = pynvml.nvmlLib\n"
            f"h = pynvml.nvmlDeviceGetHandleByUUID({UUID_A!r})\n"
            f"sys.exit(lib.nvmlDeviceSetMemoryLimits_v1(h, ctypes.byref(_Set({cgroup!r}.encode(), 0, {mib} << 20))))\n")
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake_nvml_dir())}
    return subprocess.run([sys.executable, "-c", code], check=False, timeout=30, env=env).returncode


def _read_limit(cgroup: str) -> tuple[int, int]:
    pynvml.nvmlInit()
    try:
        get = _Get(cgroup.encode(), 0, 0, 0)
        rc = pynvml.nvmlLib.nvmlDeviceGetMemoryLimits_v1(pynvml.nvmlDeviceGetHandleByUUID(UUID_A), ctypes.byref(get))
        return rc, get.hardLimit
    finally:
        pynvml.nvmlShutdown()


def test_the_cgroup_limit_is_kept_by_cgroup_across_processes_v1_refused_under_the_switch(
        fake_gpus: FakeGpuState, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus.gpu(UUID_A)
    v2 = "/sys/fs/cgroup/kubepods.slice/kubepods-pod1.slice/cri-containerd-c1.scope"
    v1 = "/sys/fs/cgroup/memory/kubepods/burstable/pod1/c1"
    assert _set_limit(v2, 4096) == 0
    assert _read_limit(v2) == (0, 4096 << 20)  # set in another process, read back here
    assert _read_limit("/sys/fs/cgroup/other")[1] == 2**64 - 1  # unset: no limit
    assert _set_limit(v1, 2048) == 0  # accepted: the test machines are cgroup v1 (the fake says so)
    assert fake_gpus.memory_limits()[(UUID_A, v1)] == 2048 << 20
    monkeypatch.setenv("GPUFRAC_FAKE_NVML_REFUSE_CGROUP_V1", "1")  # as the real driver: dmem is cgroup v2's
    assert _set_limit(v1, 2048) == pynvml.NVML_ERROR_NOT_SUPPORTED
    # a v2 path is held only where the host is cgroup v2; on a v1 or hybrid host (these machines), no path is
    host_v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    assert _set_limit(v2, 1024) == (0 if host_v2 else pynvml.NVML_ERROR_NOT_SUPPORTED)
    monkeypatch.delenv("GPUFRAC_FAKE_NVML_REFUSE_CGROUP_V1")
    fake_gpus.set(driver_version="550.54.15")  # before r615: no driver-held cgroup limit
    assert _set_limit(v2, 1024) == pynvml.NVML_ERROR_NOT_SUPPORTED
