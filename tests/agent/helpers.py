"""Builders and in-memory stand-ins shared by the agent tests (the GPU fakes live in tests/fakes)."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufrac.agent.agent import AgentConfig
from gpufrac.agent.metrics import AgentMetrics
from gpufrac.agent.model import GpuInfo, RunningContainer
from gpufrac.agent.supervisor import RestartPolicy
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import (
    DEFAULT_MPS_ROOT,
    FRACTIONAL_LABEL,
    FRACTIONAL_VALUE,
    MIB,
    CanonicalFraction,
    LimitEnv,
    format_pinned_mem_limit,
    mps_pipe_dir,
    pinned_limits,
    write_canonical,
)
from tests.fakes.build import fake_nvml_library
from tests.fakes.state import H200_MIB, ProcRoot

UUID_A = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
UUID_B = "GPU-bbbbbbbb-0000-0000-0000-000000000002"

_preloaded = False


def preload_fake_nvml() -> None:
    """Load the fake library by path, once per process, so that pynvml's own `CDLL("libnvidia-ml.so.1")` finds
    it by its soname: the dynamic loader reads LD_LIBRARY_PATH only at process start, so setting it inside
    pytest would not reach dlopen. Subprocesses (the CLI) get LD_LIBRARY_PATH instead."""
    global _preloaded
    if not _preloaded:
        ctypes.CDLL(str(fake_nvml_library()), mode=ctypes.RTLD_GLOBAL)
        _preloaded = True


def cid(n: int) -> str:
    """A 64-hex container ID."""
    return f"{n:064x}"


def gpu_info(index: int, uuid: str, total_mib: int = H200_MIB) -> GpuInfo:
    return GpuInfo(index, uuid, "NVIDIA H200", total_mib * MIB)


def container(name: str = "app", *, pod: str = "p1", namespace: str = "team-a", uid: str = "uid-1",
              container_id: str | None = None, mode: ComputeMode = ComputeMode.TIME_SLICING,
              request_mib: int | None = 2048, limit_mib: int | None = 4096,
              devices: tuple[str, ...] = (UUID_A,)) -> RunningContainer:
    return RunningContainer(namespace, pod, uid, name, container_id or cid(1),
                               fraction(name, request_mib=request_mib, limit_mib=limit_mib, devices=devices,
                                        mode=mode))


def fraction(name: str, *, request_mib: int | None, limit_mib: int | None, devices: tuple[str, ...] | list[str],
             mode: ComputeMode | str = ComputeMode.TIME_SLICING) -> CanonicalFraction:
    """One container's fraction as the webhook writes it: the same limit pinned on each device."""
    pinned = pinned_limits(limit_mib, len(devices)) if limit_mib and devices else {}
    return CanonicalFraction(name, ComputeMode(mode), request_mib, limit_mib, pinned, tuple(devices))


def injected_env(c: RunningContainer, mps_root: str = DEFAULT_MPS_ROOT) -> dict[str, str]:
    """The values the webhook's env gives this container's processes (the kubelet resolves its fieldRefs)."""
    spec = c.fraction
    env = {LimitEnv.PIPE_DIRECTORY.value: mps_pipe_dir(mps_root, spec.mode), "PATH": "/usr/bin"}
    if spec.limit_mib is not None:
        env[LimitEnv.MEMORY_LIMIT] = str(spec.limit_mib)
    if spec.request_mib is not None:
        env[LimitEnv.MEMORY_REQUEST] = str(spec.request_mib)
    if spec.pinned_mem_limit_mib:
        env[LimitEnv.PINNED_MEM_LIMIT] = format_pinned_mem_limit(spec.pinned_mem_limit_mib)
    if spec.devices:
        env[LimitEnv.VISIBLE_DEVICES] = ",".join(spec.devices)
    return env


def pod(name: str, *, uid: str, containers: dict[str, str], annotations: dict[str, str],
        namespace: str = "team-a", node: str = "gpu-node-1", running: bool = True,
        runtime: str = "containerd") -> dict[str, Any]:
    """A pod as the API returns it; `containers` maps names to 64-hex container IDs."""
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "1",
                     "labels": {FRACTIONAL_LABEL: FRACTIONAL_VALUE}, "annotations": annotations},
        "spec": {"nodeName": node, "containers": [{"name": n, "image": "cuda"} for n in containers]},
        "status": {"phase": "Running" if running else "Pending", "containerStatuses": [
            {"name": n, "containerID": f"{runtime}://{i}", "ready": running,
             "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}} if running else
             {"waiting": {"reason": "ContainerCreating"}}}
            for n, i in containers.items()]},
    }


def canonical_annotations(container_name: str, *, request_mib: int, limit_mib: int, devices: list[str],
                          mode: str = "time-slicing") -> dict[str, str]:
    """A pod's annotations for one fractional container, from the contract's own writer."""
    return write_canonical([fraction(container_name, request_mib=request_mib, limit_mib=limit_mib, devices=devices,
                                     mode=mode)])


class FakeKube:
    """An in-memory API for the agent's Kubernetes edge: records node patches, events and evictions."""

    def __init__(self, pods: list[dict[str, Any]] | None = None) -> None:
        self.pods = pods or []
        self.labels: dict[str, str] = {}
        self.conditions: list[dict[str, Any]] = []
        self.events: dict[tuple[str, str], dict[str, Any]] = {}
        self.create_event_calls = 0
        self.evictions: list[tuple[str, str]] = []

    def patch_node_labels(self, node: str, labels: dict[str, str]) -> None:
        self.labels.update(labels)

    def patch_node_condition(self, node: str, condition: dict[str, Any]) -> None:
        self.conditions.append(condition)

    def last_condition(self, condition_type: str = "gpufrac.io/Ready") -> dict[str, Any]:
        return next((c for c in reversed(self.conditions) if c["type"] == condition_type), {})

    def create_event(self, namespace: str, body: dict[str, Any]) -> bool:
        self.create_event_calls += 1
        metadata = body["metadata"]
        key = (namespace, metadata.get("name") or f"{metadata['generateName']}{self.create_event_calls}")
        if key in self.events:
            return False
        self.events[key] = body
        return True

    def evict_pod(self, namespace: str, name: str) -> bool:
        self.evictions.append((namespace, name))
        return True

    def list_pods(self, node: str) -> tuple[list[dict[str, Any]], str]:
        return list(self.pods), "100"

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return next((p for p in self.pods if p["metadata"]["namespace"] == namespace
                     and p["metadata"]["name"] == name), None)

    def watch_pods(self, node: str, resource_version: str, timeout_seconds: int):
        import threading
        threading.Event().wait(0.05)  # an idle watch that ends (server timeout)
        return iter(())


def two_pod_node(tmp_path: Path, mps_binary: str, restart_policy: RestartPolicy) -> tuple[ProcRoot, FakeKube,
                                                                                        AgentConfig]:
    """A node's pods and agent settings: `train` (time-slicing, 20000 MiB on GPU A) and `infer` (sm-sharing, 10000
    MiB request / 16000 MiB limit on GPU B), a fake /proc, and an agent config that ticks every 50 ms."""
    proc = ProcRoot(tmp_path / "proc")
    ts_ann = canonical_annotations("app", request_mib=20000, limit_mib=20000, devices=[UUID_A])
    sm_ann = canonical_annotations("worker", request_mib=10000, limit_mib=16000, devices=[UUID_B],
                                   mode="sm-sharing")
    kube = FakeKube([pod("train", uid="u-train", containers={"app": cid(1)}, annotations=ts_ann),
                     pod("infer", uid="u-infer", containers={"worker": cid(2)}, annotations=sm_ann)])
    config = AgentConfig(node="gpu-node-1", mps_binary=mps_binary, mps_root=tmp_path / "mps",
                         mps_log_root=tmp_path / "log", mps_config_dir=tmp_path / "cfg", proc_root=proc.root,
                         memory_limit_file=tmp_path / "memory.max", interval=0.05,
                         restart_policy=restart_policy, quit_timeout=5.0)
    return proc, kube, config


def env_for(mode: str, limit: int, request: int, devices: str) -> dict[str, str]:
    return {"NVIDIA_GPU_MEMORY_LIMIT": str(limit), "NVIDIA_GPU_MEMORY_REQUEST": str(request),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={limit}M", "CUDA_MPS_PIPE_DIRECTORY": f"/run/gpufrac/mps/{mode}",
            "NVIDIA_VISIBLE_DEVICES": devices}


def scrape(metrics: AgentMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    values = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def value(metrics: AgentMetrics, name: str, **labels: str) -> float | None:
    return scrape(metrics).get((name, tuple(sorted(labels.items()))))
