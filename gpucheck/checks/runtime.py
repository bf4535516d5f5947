"""Row 8, the node's container runtime: containerd 2 with NRI and CDI, gpufrac's NRI plugin, NVIDIA's CDI spec."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

from gpucheck.contract import (
    DEVICE_PLUGIN_CDI_KIND,
    FRACTION_CONTAINER,
    GPUFRAC_MPS_ROOT,
    SM_SHARING,
    daemon_layout,
    fraction_annotations,
    fraction_env,
)
from gpucheck.files import is_socket
from gpucheck.judge import judge_container_limits, judge_devices
from gpucheck.nvml import NvmlError
from gpucheck.rows import FAIL, SKIPPED, Row
from gpucheck.session import Session


class Runtime:
    """Two pods made through the node's CRI with `crictl`, as the kubelet would make them: a bound sm-sharing
    fraction whose GPU is named by its CDI device (`k8s.device-plugin.nvidia.com/gpu=<uuid>`, as KAI's binder writes
    it on CDI clusters), and a plain pod that asks for every GPU by env. gpufrac's NRI plugin decides what each
    container gets; NVIDIA's CDI spec for that device carries the hook that applies the CUDA 13.4 limits."""

    CDI_DEVICES = "8a", "CDI device: exactly its GPU"
    CDI_LIMITS = "8b", "CDI device: 13.4 limits on its cgroup"
    OUTSIDE = "8c", "outside the plugin's decision: no GPU"

    def __init__(self, session: Session) -> None:
        self.s = session
        self.crictl: str | None = None
        self.image: str | None = None
        self.sandboxes: list[str] = []
        self.dir = os.path.join(session.root, "runtime")

    def problem(self) -> str | None:
        args = self.s.args
        self.crictl = args.crictl or shutil.which("crictl")
        if self.crictl is None or not os.access(self.crictl, os.X_OK):
            return "crictl not found (PATH or --crictl): the runtime checks make pods through the node's CRI"
        endpoint = args.runtime_endpoint
        if endpoint.startswith("unix://") and not is_socket(endpoint[len("unix://"):]):
            return f"no CRI socket at {endpoint} (--runtime-endpoint)"
        self.image = args.image or self.find_image()
        if not self.image:
            return "no --image, and no gpufrac image on the node: name one there with sh, ls and sleep"
        return None

    def find_image(self) -> str | None:
        try:
            return gpufrac_image(json.loads(self.call("images", "-o", "json")))
        except (RuntimeError, ValueError):
            return None

    def run(self) -> None:
        s = self.s
        rows = (self.CDI_DEVICES, self.CDI_LIMITS, self.OUTSIDE)
        reason = self.problem() or (None if s.node.gpu_uuid else "no GPU to name")
        if reason:
            s.skip(rows, reason)
            return
        os.makedirs(self.dir, exist_ok=True)
        s.guarded(self.CDI_DEVICES[0], self.cdi)
        s.guarded(self.OUTSIDE[0], self.outside)

    def cdi(self) -> None:
        """8a and 8b: one bound fraction, its GPU by CDI name."""
        s, node = self.s, self.s.node
        assert node.gpu_uuid is not None
        request, limit = node.limits()
        devices = f"{DEVICE_PLUGIN_CDI_KIND}={node.gpu_uuid}"
        pipe_dir = os.path.join(GPUFRAC_MPS_ROOT, SM_SHARING)
        numbers: dict[str, Any] = {"devices": devices, "request_mib": request, "limit_mib": limit}
        try:
            container = self.start_pod("cdi", fraction_annotations(FRACTION_CONTAINER, SM_SHARING, request, limit,
                                                                   devices),
                                       FRACTION_CONTAINER, fraction_env(request, limit, pipe_dir, devices),
                                       # as the webhook mounts it: gpufrac refuses an sm-sharing fraction without it
                                       {pipe_dir: daemon_layout(s.root, SM_SHARING).pipe_dir})
            seen = self.devices(container)
        except (RuntimeError, OSError, ValueError) as err:
            s.skip((self.CDI_LIMITS,), "no container (8a)")
            s.add(Row(*self.CDI_DEVICES, FAIL, f"{devices}: {err}", numbers))
            return
        status, text = judge_devices(seen, f"nvidia{s.args.gpu}")
        s.add(Row(*self.CDI_DEVICES, status, f"{devices}: {text}", {**numbers, "seen": seen}))
        self.limits(container, request, limit, numbers)

    def limits(self, container: str, request: int, limit: int, numbers: dict[str, Any]) -> None:
        s, node = self.s, self.s.node
        row_id, name = self.CDI_LIMITS
        reason = None if node.driver_limits else "the driver has no CUDA 13.4 memory limits (needs r615+ and CUDA 13.4)"
        if not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            reason = reason or "cgroup v2 is not mounted at /sys/fs/cgroup (the 13.4 limits are per cgroup v2)"
        if reason:
            s.add(Row(row_id, name, SKIPPED, reason))
            return
        assert node.nvml is not None and node.handle is not None
        try:
            cgroup = self.cgroup(container)
            read_back = node.nvml.get_memory_limits(node.handle, cgroup)
        except (RuntimeError, OSError, ValueError, NvmlError) as err:
            s.add(Row(row_id, name, FAIL, str(err), numbers))
            return
        status, text = judge_container_limits(read_back, request, limit)
        s.add(Row(row_id, name, status, f"{text} ({cgroup})", {**numbers, "cgroup": cgroup, "read_back": read_back}))

    def outside(self) -> None:
        row_id, name = self.OUTSIDE
        try:
            # where the image's ENV asks already (a CUDA image), the pod does not say it twice: the runtime would keep
            # both entries, which gpufrac refuses rather than voids (docs/security.md, the escape matrix, row 8)
            asks = {} if self.image_sets("NVIDIA_VISIBLE_DEVICES") else {"NVIDIA_VISIBLE_DEVICES": "all"}
            seen = self.devices(self.start_pod("plain", {}, "plain", asks))
        except (RuntimeError, OSError, ValueError) as err:
            self.s.add(Row(row_id, name, FAIL, str(err)))
            return
        status, text = judge_devices(seen, None)
        self.s.add(Row(row_id, name, status, f"a plain pod with NVIDIA_VISIBLE_DEVICES=all: {text}",
                       {"seen": seen}))

    # ---- crictl ----

    def call(self, *argv: str, timeout: float | None = None) -> str:
        assert self.crictl is not None
        cmd = [self.crictl, "--runtime-endpoint", self.s.args.runtime_endpoint, *argv]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, check=False,
                                  timeout=timeout if timeout is not None else self.s.bounded(90))
        except subprocess.TimeoutExpired as err:
            raise RuntimeError(f"crictl {argv[0]} did not answer within {err.timeout:.0f}s") from None
        if done.returncode != 0:
            raise RuntimeError(f"crictl {argv[0]}: {(done.stderr or done.stdout).strip()[-400:]}")
        return done.stdout.strip()

    def write(self, name: str, config: dict[str, Any]) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            json.dump(config, f)
        return path

    def start_pod(self, pod: str, annotations: dict[str, str], container: str, env: dict[str, str],
                  mounts: dict[str, str] | None = None) -> str:
        """A pod sandbox (host network) with these annotations and one running container; the container's id."""
        uid = f"gpufrac-gpu-check-{os.getpid()}-{pod}"
        sandbox = self.write(f"{pod}-pod.json", {
            "metadata": {"name": f"gpu-check-{pod}", "namespace": "gpufrac-gpu-check", "uid": uid, "attempt": 0},
            "annotations": annotations, "log_directory": os.path.join(self.dir, f"{pod}-logs"),
            "linux": {"security_context": {"namespace_options": {"network": 2}}}})  # NODE: no CNI needed
        sandbox_id = self.call("runp", sandbox)
        self.sandboxes.append(sandbox_id)
        config = self.write(f"{pod}-{container}.json", {
            "metadata": {"name": container}, "image": {"image": self.image},
            "command": ["sleep", "3600"], "envs": [{"key": k, "value": v} for k, v in env.items()],
            "mounts": [{"container_path": inside, "host_path": host} for inside, host in (mounts or {}).items()],
            "log_path": f"{container}.log"})
        container_id = self.call("create", sandbox_id, config, sandbox)  # the plugin may refuse it here
        self.call("start", container_id)
        return container_id

    def image_sets(self, name: str) -> bool:
        """Whether the check's image sets this env name itself (its config's ENV)."""
        assert self.image is not None
        config = json.loads(self.call("inspecti", "-o", "json", self.image)).get("info", {}).get("imageSpec", {})
        return any(entry.partition("=")[0] == name for entry in config.get("config", {}).get("Env") or [])

    def devices(self, container_id: str) -> list[str]:
        """The NVIDIA device nodes the container sees."""
        listing = self.call("exec", container_id, "ls", "/dev")
        return sorted(name for name in listing.split() if name.startswith("nvidia"))

    def cgroup(self, container_id: str) -> str:
        """The container's cgroup v2 directory on the host (what the toolkit's hook hands NVML)."""
        pid = json.loads(self.call("inspect", container_id)).get("info", {}).get("pid")
        if not pid:
            raise RuntimeError(f"crictl inspect {container_id}: no pid")
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return "/sys/fs/cgroup" + line[3:].strip()
        raise RuntimeError(f"pid {pid} has no cgroup v2 path")

    def cleanup(self) -> None:
        for sandbox_id in reversed(self.sandboxes):
            for step in ("stopp", "rmp"):
                try:
                    self.call(step, sandbox_id, timeout=60)
                except RuntimeError as err:
                    self.s.log(f"could not {step} {sandbox_id}: {err}")
        self.sandboxes.clear()


def gpufrac_image(images: dict[str, Any]) -> str | None:
    """gpufrac's own image among those `crictl images -o json` lists (the agent's: it has sh, ls and sleep)."""
    for image in images.get("images") or []:
        for tag in image.get("repoTags") or []:
            if tag.rsplit(":", 1)[0].rsplit("/", 1)[-1] == "gpufrac":
                return str(tag)
    return None
