"""Whether the node's container runtime can deliver a fraction's GPU with its driver: the runtime's version, the CDI
devices that name each GPU. Pure: the agent's node condition, the NRI plugin's refusal and `gpufrac node-check` ask it.

- NRI plugins can hand containers CDI devices from containerd 2.1 on; containerd 2.0 (and 1.7's NRI) accepts the
  adjustment and silently drops the devices, so a fraction would start without its GPU.
- A GPU no CDI spec names can only be handed out as a bare device node: no driver libraries, no hooks, so CUDA in
  the container fails (or, under NVIDIA's legacy runtime, depends on an env var any pod may set).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpufrac.agent.decide.capabilities import NRI_UNAVAILABLE
from gpufrac.agent.decide.model import GpuInfo

# containerd from which NRI plugins' CDI device adjustments are applied (2.0 drops them silently).
MIN_CDI_CONTAINERD = (2, 1)
# NVIDIA's CDI kinds: the device plugin's, then the toolkit's (the NRI decision looks names up under the same).
NVIDIA_CDI_KINDS = ("k8s.device-plugin.nvidia.com/gpu", "nvidia.com/gpu")

CONTAINERD_TOO_OLD = "ContainerdTooOld"  # node condition reasons
NO_CDI_SPEC = "NoCdiSpecForGpu"
# The reasons of gpufrac_node_runtime_problem: the two above, and the NRI plugin finding no socket.
METRIC_REASONS = (CONTAINERD_TOO_OLD, NO_CDI_SPEC, NRI_UNAVAILABLE)
REFUSE_RUNTIME_DROPS_CDI = "GPURuntimeDropsCdi"  # NRI refusal reasons (Event reasons on the pod)
REFUSE_NO_CDI_SPEC = "GPUWithoutCdiSpec"

CDI_GENERATE = ("generate a CDI spec for every GPU: `nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml` "
                "(the GPU Operator and NVIDIA's device plugin with deviceListStrategy cdi-cri write one)")
UPGRADE_CONTAINERD = "upgrade containerd to 2.1 or later"

_VERSION = re.compile(r"(?<![\w.])v?(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class RuntimeVersion:
    name: str  # "containerd", "cri-o", ...
    version: tuple[int, ...]  # (2, 4, 2)
    text: str  # as it was read

    def __str__(self) -> str:
        return f"{self.name} {'.'.join(map(str, self.version))}"


def parse_runtime(text: str) -> RuntimeVersion | None:
    """The runtime in `containerd --version` ("containerd github.com/containerd/containerd/v2 v2.4.2 <commit>"), the
    kubelet's nodeInfo ("containerd://2.0.5"), NRI's Configure or crictl ("containerd v2.4.2"); None: unreadable."""
    stripped = text.strip()
    if not stripped:
        return None
    name = re.split(r"://|\s", stripped, maxsplit=1)[0].lower()
    rest = stripped[len(name):]
    match = _VERSION.search(rest)
    if not name or match is None:
        return None
    version = tuple(int(part) for part in match.groups() if part is not None)
    return RuntimeVersion(name, version, stripped)


def drops_nri_cdi(runtime: RuntimeVersion) -> bool:
    """Whether this runtime drops the CDI devices an NRI plugin hands a container (containerd before 2.1)."""
    return runtime.name == "containerd" and runtime.version[:2] < MIN_CDI_CONTAINERD


def cdi_names_for(gpu: GpuInfo, cdi_devices: Collection[str]) -> list[str]:
    """The CDI devices (`kind=name`) under NVIDIA's kinds that name this GPU, by UUID or index."""
    return [f"{kind}={name}" for kind in NVIDIA_CDI_KINDS for name in (gpu.uuid, str(gpu.index))
            if f"{kind}={name}" in cdi_devices]


def gpus_without_cdi(gpus: Iterable[GpuInfo], cdi_devices: Collection[str]) -> list[GpuInfo]:
    return [gpu for gpu in gpus if not cdi_names_for(gpu, cdi_devices)]


def describe_gpus(gpus: Sequence[GpuInfo]) -> str:
    return ", ".join(f"{gpu.index} ({gpu.uuid})" for gpu in gpus)


def runtime_problems(runtime_text: str, gpus: Sequence[GpuInfo], cdi_devices: Collection[str],
                     cdi_dirs: Sequence[str] = ()) -> list[tuple[str, str]]:
    """The node condition's problems of the delivery path (reason, message with what to do), for a node whose agent
    runs the NRI plugin. An unknown runtime (the plugin not registered yet) is no problem of its own: the plugin's
    state says that."""
    problems = []
    runtime = parse_runtime(runtime_text)
    if runtime is not None and drops_nri_cdi(runtime):
        problems.append((CONTAINERD_TOO_OLD,
                         f"{runtime} drops the CDI devices NRI plugins inject (from containerd 2.1 on they are "
                         "applied): fractional containers would start without their GPU; "
                         f"{UPGRADE_CONTAINERD}"))
    missing = gpus_without_cdi(gpus, cdi_devices)
    if missing:
        where = f" in {', '.join(cdi_dirs)}" if cdi_dirs else ""
        problems.append((NO_CDI_SPEC,
                         f"no CDI spec{where} names GPU(s) {describe_gpus(missing)}: a fraction there would get a "
                         "bare device node without driver libraries; " + CDI_GENERATE))
    return problems


@dataclass(frozen=True)
class DeliveryFacts:
    """What the NRI decision needs to know of the runtime to tell whether a fraction's devices would work."""

    runtime: str = ""  # as NRI's Configure reported it ("containerd v2.4.2"); "" not known yet
    device_nodes_allowed: bool = False  # the operator accepts bare device nodes where no CDI spec names a GPU


def delivery_refusal(cdi_devices: Sequence[str], bare_gpus: Sequence[str],
                     delivery: DeliveryFacts | None) -> tuple[str, str] | None:
    """Why a fraction given these CDI devices, and bare device nodes for these GPUs (no CDI spec names them), would
    not get a working GPU (reason, message with what to do); None: it would, or the facts are not known."""
    if delivery is None:
        return None
    runtime = parse_runtime(delivery.runtime)
    if cdi_devices and runtime is not None and drops_nri_cdi(runtime):
        return (REFUSE_RUNTIME_DROPS_CDI,
                f"its GPU would come as CDI devices ({', '.join(cdi_devices)}), which {runtime} drops without a "
                f"word (NRI plugins' CDI devices are applied from containerd 2.1 on): {UPGRADE_CONTAINERD}")
    if bare_gpus and not delivery.device_nodes_allowed:
        return (REFUSE_NO_CDI_SPEC,
                f"no CDI spec on this node names GPU {', '.join(bare_gpus)}: it would get a bare device node "
                "without driver libraries; " + CDI_GENERATE)
    return None


def runtime_problem_event(node: str, reason: str, message: str, now: dt.datetime | None = None) -> dict[str, Any]:
    """A Warning Event on the Node for one delivery problem, named by node, reason and message: an agent restart
    that finds the same problem finds its Event already there."""
    digest = hashlib.sha256("\0".join((node, reason, message)).encode()).hexdigest()[:16]
    stamp = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{node[:200]}.gpufrac-runtime-{digest}", "namespace": "default",
                     "labels": {"gpufrac.io/node-problem": reason}},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "reason": reason,
        "message": message[:1024],
        "type": "Warning",
        "source": {"component": "gpufrac-agent", "host": node},
        "reportingComponent": "gpufrac.io/gpufrac-agent",
        "reportingInstance": node,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
