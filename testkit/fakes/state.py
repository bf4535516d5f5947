"""State the GPU fakes read: the fake NVML's JSON file, and a fake /proc (`<root>/<pid>/{cgroup,environ}`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

H200_MIB = 143771
# An H200 SXM as NVML describes it: its PCI device id (device 0x2335, vendor 0x10de), Hopper, compute capability 9.0,
# brand NVIDIA, MIG off (up to 7 MIG devices); and the bus IDs of an eight-GPU HGX board's slots, in NVML's index order.
H200_PCI_DEVICE_ID = "0x233510de"
HGX_BUS_IDS = ("00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0",
               "00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0")



def _bus_id(index: int) -> str:
    """The HGX slots' bus IDs, a board per PCI domain: GPU 8 is domain 1's first slot."""
    domain, slot = divmod(index, len(HGX_BUS_IDS))
    return f"{domain:08X}{HGX_BUS_IDS[slot][8:]}"


class FakeGpuState:
    """The JSON state file the fake libnvidia-ml.so.1 reads on every call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.state: dict[str, Any] = {"driver_version": "615.20", "cuda_driver_version": 13040, "gpus": []}
        self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state))
        os.replace(tmp, self.path)

    def set(self, **fields: Any) -> FakeGpuState:
        self.state.update(fields)
        self.write()
        return self

    def gpu(self, uuid: str, name: str = "NVIDIA H200", memory_total_mib: int = H200_MIB,
            processes: list[dict[str, int]] | None = None, reserved_memory_mib: int = 0) -> FakeGpuState:
        """One more GPU, an H200 in the board's next slot: its minor number (/dev/nvidia<minor>) is its index."""
        index = len(self.state["gpus"])
        self.state["gpus"].append({"uuid": uuid, "name": name, "memory_total_mib": memory_total_mib,
                                   "reserved_memory_mib": reserved_memory_mib, "processes": processes or [],
                                   "minor_number": index, "pci_bus_id": _bus_id(index),
                                   "pci_device_id": H200_PCI_DEVICE_ID, "architecture": "hopper",
                                   "cuda_compute_capability": "9.0", "brand": "nvidia", "mig_mode": 0,
                                   "max_mig_devices": 7})
        self.write()
        return self

    def xid_error(self, uuid: str, xid: int) -> None:
        """A critical XID error on that GPU: the fake NVML delivers it to event sets registered for XID events
        (NVIDIA's device plugin then marks the GPU unhealthy, unless that XID is one it ignores)."""
        for gpu in self.state["gpus"]:
            if gpu["uuid"] == uuid:
                gpu.setdefault("xid_errors", []).append(xid)
        self.write()

    def charge_mps_clients_to_server(self, uuid: str) -> None:
        """That GPU reports MPS clients' memory on their server (fake_nvml.c, "mps_memory": "server")."""
        for gpu in self.state["gpus"]:
            if gpu["uuid"] == uuid:
                gpu["mps_memory"] = "server"
        self.write()

    def reserve(self, uuid: str, reserved_memory_mib: int) -> None:
        """What the driver keeps of that GPU (NVML v2 memory info's `reserved`)."""
        for gpu in self.state["gpus"]:
            if gpu["uuid"] == uuid:
                gpu["reserved_memory_mib"] = reserved_memory_mib
        self.write()

    def compute_mode(self, uuid: str) -> int:
        """The GPU's compute mode as the fake NVML answers it: what nvmlDeviceSetComputeMode last set, else 0."""
        mode = 0
        for line in self._side_lines("compute-modes"):
            key, value = line.split()
            mode = int(value) if key == uuid else mode
        return mode

    def memory_limits(self) -> dict[tuple[str, str], int]:
        """The hard limits set with nvmlDeviceSetMemoryLimits_v1, in bytes, by (GPU UUID, cgroup path)."""
        limits = {}
        for line in self._side_lines("memory-limits"):
            uuid, hard, _soft, path = line.split(" ", 3)
            limits[(uuid, path)] = int(hard)
        return limits

    def _side_lines(self, what: str) -> list[str]:
        side = self.path.with_name(f"{self.path.name}.{what}")
        return side.read_text().splitlines() if side.exists() else []

    def processes(self, uuid: str, processes: list[dict[str, int]]) -> None:
        for gpu in self.state["gpus"]:
            if gpu["uuid"] == uuid:
                gpu["processes"] = processes
        self.write()


CGROUP_FORMS = {
    "v2-containerd-systemd": "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
                             "cri-containerd-{id}.scope\n",
    "v2-crio-systemd": "0::/kubepods.slice/kubepods-pod{uid}.slice/crio-{id}.scope\n",
    "v2-cgroupfs": "0::/kubepods/besteffort/pod{uid}/{id}\n",
    "v1-cgroupfs": "12:memory:/kubepods/burstable/pod{uid}/{id}\n11:cpuset:/kubepods/burstable/pod{uid}/{id}\n"
                   "1:name=systemd:/kubepods/burstable/pod{uid}/{id}\n",
    "v1-docker-systemd": "4:devices:/kubepods.slice/kubepods-pod{uid}.slice/docker-{id}.scope\n",
}


class ProcRoot:
    """A fake /proc: `<root>/<pid>/cgroup` and `<root>/<pid>/environ`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def add(self, pid: int, container_id: str, env: dict[str, str], *, form: str = "v2-containerd-systemd",
            pod_uid: str = "uid-1", real: bool = False) -> None:
        """A process of that container. `real`: `pid` is a live process of this machine, whose /proc/<pid>/stat
        (its start time) the entry shows, so the agent can tell it from a reused PID and signal it."""
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        (d / "cgroup").write_text(CGROUP_FORMS[form].format(uid=pod_uid.replace("-", "_"), id=container_id))
        (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
        if real:
            (d / "stat").symlink_to(f"/proc/{pid}/stat")

    def add_program(self, pid: int, argv: list[str], cgroup: str = "0::/system.slice/gpufrac-mps.service\n") -> None:
        """A process outside any container, known by its command line (an MPS server, say)."""
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        (d / "cgroup").write_text(cgroup)
        (d / "cmdline").write_bytes(b"".join(arg.encode() + b"\0" for arg in argv))
