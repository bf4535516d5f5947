"""The cgroups check 3 makes for its clients (CUDA 13.4's limits are per cgroup v2), and their removal."""

from __future__ import annotations

import os

from gpucheck.files import write_quietly
from gpucheck.nvml import NVML_DEVICE_MEMORY_LIMIT_MAX, NvmlError
from gpucheck.session import Session


class Cgroups:
    """The cgroups check 3 makes (under /sys/fs/cgroup/gpufrac-gpu-check-<pid>), and their removal."""

    def __init__(self, session: Session) -> None:
        self.s = session
        self.made: list[str] = []
        self.root_dmem_enabled = False

    def problem(self) -> str | None:
        node = self.s.node
        if not node.driver_limits:
            return "the driver has no CUDA 13.4 memory limits (needs r615+ and CUDA 13.4)"
        if node.nvml is None or not node.nvml.has("nvmlDeviceSetMemoryLimits_v1"):
            return "NVML has no nvmlDeviceSetMemoryLimits_v1"
        if not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            return "cgroup v2 is not mounted at /sys/fs/cgroup"
        if os.geteuid() != 0:
            return "setting memory limits needs root"
        return None

    def parent(self) -> str:
        parent = f"/sys/fs/cgroup/gpufrac-gpu-check-{os.getpid()}"
        if parent not in self.made:
            os.makedirs(parent, exist_ok=True)
            self.made.append(parent)
            # dmem backend: each level must enable dmem for the leaf to have its own dmem.* files
            with open("/sys/fs/cgroup/cgroup.controllers") as f:
                dmem = "dmem" in f.read().split()
            if dmem:
                with open("/sys/fs/cgroup/cgroup.subtree_control") as f:
                    enabled = "dmem" in f.read().split()
                if not enabled:
                    write_quietly("/sys/fs/cgroup/cgroup.subtree_control", "+dmem")
                    self.root_dmem_enabled = True
                write_quietly(os.path.join(parent, "cgroup.subtree_control"), "+dmem")
        return parent

    def leaf(self, name: str) -> str:
        leaf = os.path.join(self.parent(), name)
        os.makedirs(leaf, exist_ok=True)
        self.made.append(leaf)
        return leaf

    def remove(self) -> None:
        nvml, handle = self.s.node.nvml, self.s.node.handle
        for path in reversed(self.made):
            if nvml is not None and handle is not None and path.count("/") > 4:
                try:  # zero the soft limit first, so dmem ancestors give back the reservation
                    nvml.set_memory_limits(handle, path, 0, NVML_DEVICE_MEMORY_LIMIT_MAX)
                except NvmlError:
                    pass
            try:
                os.rmdir(path)
            except OSError as err:
                self.s.log(f"could not remove cgroup {path}: {err}")
        self.made.clear()
        if self.root_dmem_enabled:
            write_quietly("/sys/fs/cgroup/cgroup.subtree_control", "-dmem")
