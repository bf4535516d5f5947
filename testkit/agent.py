"""Builders and in-memory stand-ins shared by the agent tests, and the agent's fake node (FakeNode) their fixtures
hand out (the GPU fakes live in testkit/fakes)."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufrac.agent.decide.claim_tenants import ClaimTenants
from gpufrac.agent.decide.model import EvictionOutcome, GpuInfo, RunningContainer
from gpufrac.agent.edges.metrics import AgentMetrics
from gpufrac.agent.edges.nvml import NvmlSource
from gpufrac.agent.edges.supervisor import RestartPolicy
from gpufrac.agent.node.agent_config import AgentConfig
from gpufrac.agent.node.doors import NO_CHECKS, DoorFactory, HoldsNothing, NodeChecks
from gpufrac.agent.node.node_loop import Agent
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
from gpufrac.kube.errors import KubeError
from testkit.fakes.build import fake_nvml_library
from testkit.fakes.state import H200_MIB, FakeGpuState, ProcRoot
from testkit.pods import running_pod

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
              devices: tuple[str, ...] = (UUID_A,), active_thread_percent: int | None = None) -> RunningContainer:
    return RunningContainer(namespace, pod, uid, name, container_id or cid(1),
                               fraction(name, request_mib=request_mib, limit_mib=limit_mib, devices=devices,
                                        mode=mode, active_thread_percent=active_thread_percent))


def fraction(name: str, *, request_mib: int | None, limit_mib: int | None, devices: tuple[str, ...] | list[str],
             mode: ComputeMode | str = ComputeMode.TIME_SLICING,
             active_thread_percent: int | None = None) -> CanonicalFraction:
    """One container's fraction as the webhook writes it: the same limit pinned on each device."""
    pinned = pinned_limits(limit_mib, len(devices)) if limit_mib and devices else {}
    return CanonicalFraction(name, ComputeMode(mode), request_mib, limit_mib, pinned, tuple(devices),
                             active_thread_percent)


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
    if spec.active_thread_percent is not None:
        env[LimitEnv.ACTIVE_THREAD_PERCENTAGE] = str(spec.active_thread_percent)
    return env


def pod(name: str, **fields: Any) -> dict[str, Any]:
    """A pod bound to the node, labelled fractional as the webhook labels it (testkit.pods.running_pod's fields:
    uid, containers (names to 64-hex container IDs), annotations, ...)."""
    return running_pod(name, labels={FRACTIONAL_LABEL: FRACTIONAL_VALUE}, **fields)


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
        self.blocked: set[str] = set()  # pod names a PodDisruptionBudget protects: their evictions get 429
        self.label_patches: list[dict[str, str | None]] = []  # each patch of the node's labels, in order
        self.evicted_after_patch: list[int] = []  # per eviction: the index of the last label patch before it
        self.eviction_options: list[dict[str, Any]] = []  # per eviction asked for: the pod's name, UID, grace period
        # KAI's PodGroups by (namespace, name); an exception is what reading that one raises
        self.pod_groups: dict[tuple[str, str], dict[str, Any] | Exception] = {}
        self.label_error: KubeError | None = None  # what patching the node's labels raises (None: it works)
        self.pod_errors: dict[str, KubeError] = {}  # by pod name: what reading that pod raises
        self.list_error: KubeError | None = None  # what listing a namespace's pods by label raises
        self.other_nodes: dict[str, dict[str, str]] = {}  # the cluster's other nodes, by name: their labels
        self.lists: list[str] = []  # each cluster-wide list the agent made (unbound fractions, labelled nodes)

    def patch_node_labels(self, node: str, labels: Mapping[str, str | None]) -> None:
        if self.label_error is not None:
            raise self.label_error
        self.label_patches.append(dict(labels))
        for key, label in labels.items():
            if label is None:
                self.labels.pop(key, None)
            else:
                self.labels[key] = label

    def node_labels(self, node: str) -> dict[str, str]:
        return dict(self.labels)

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
        return self.request_eviction(namespace, name)[0] is EvictionOutcome.EVICTED

    def request_eviction(self, namespace: str, name: str, *, uid: str = "",
                         grace_seconds: int | None = None) -> tuple[EvictionOutcome, str]:
        self.eviction_options.append({"name": name, "uid": uid, "grace_seconds": grace_seconds})
        if uid and not any(p["metadata"]["name"] == name and p["metadata"].get("uid") == uid for p in self.pods):
            raise KubeError(f"evicting pod {namespace}/{name}: 409 Conflict: the UID in the precondition ({uid}) "
                            "does not match the UID in the object")
        if name in self.blocked:
            return EvictionOutcome.BLOCKED, "Cannot evict pod as it would violate the pod's disruption budget."
        self.evictions.append((namespace, name))
        self.evicted_after_patch.append(len(self.label_patches) - 1)
        return EvictionOutcome.EVICTED, ""

    def _fractional(self) -> list[dict[str, Any]]:
        return [p for p in self.pods if (p["metadata"].get("labels") or {}).get(FRACTIONAL_LABEL) == FRACTIONAL_VALUE]

    def list_pods(self, node: str) -> tuple[list[dict[str, Any]], str]:
        """As the agent's selector lists them: the pods gpufrac labelled that a node has (spec.nodeName=<node> never
        matches an unbound pod; a DRA claim's pod is read by get_pod)."""
        return [p for p in self._fractional() if (p.get("spec") or {}).get("nodeName")], "100"

    def list_unbound_fractions(self) -> list[dict[str, Any]]:
        """The selector's `spec.nodeName=`: the labelled pods no node has."""
        self.lists.append("unbound fractions")
        return [p for p in self._fractional() if not (p.get("spec") or {}).get("nodeName")]

    def labelled_nodes(self, label: str) -> list[dict[str, str]]:
        """This node (its labels as patched) and the other nodes, where they carry `label`."""
        self.lists.append(f"nodes {label}")
        return [dict(labels) for labels in (self.labels, *self.other_nodes.values()) if label in labels]

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        if name in self.pod_errors:
            raise self.pod_errors[name]
        return next((p for p in self.pods if p["metadata"]["namespace"] == namespace
                     and p["metadata"]["name"] == name), None)

    def list_namespaced_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """The namespace's pods with the one label `key=value` (every pod here, not only the node's)."""
        if self.list_error is not None:
            raise self.list_error
        key, _, wanted = label_selector.partition("=")
        return [p for p in self.pods if p["metadata"]["namespace"] == namespace
                and (p["metadata"].get("labels") or {}).get(key) == wanted]

    def get_pod_group(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.pod_groups.get((namespace, name))
        if isinstance(found, Exception):
            raise found
        return found

    def watch_pods(self, node: str, resource_version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]:
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
                         restart_policy=restart_policy, quit_timeout=5.0,
                         cgroup_controllers_file=tmp_path / "cgroup.controllers")
    return proc, kube, config



FAST_RESTARTS = RestartPolicy(0.01, 0.05, 3, 300.0)  # the MPS daemons restart at once, 3 times


@dataclass
class FakeNode:
    """The agent's world on a fake node: the fake NVML's GPUs A and B (80000 MiB each), a fake /proc, the API's
    pods `train` and `infer` (two_pod_node) and the agent's settings; the agents started here stop with it."""

    gpus: FakeGpuState
    proc: ProcRoot
    kube: FakeKube
    config: AgentConfig
    tmp: Path
    started: list[Agent] = field(default_factory=list)

    @classmethod
    def two_pods(cls, tmp: Path, gpus: FakeGpuState, mps_binary: str,
                 restart_policy: RestartPolicy = FAST_RESTARTS) -> FakeNode:
        gpus.gpu(UUID_A, memory_total_mib=80000).gpu(UUID_B, memory_total_mib=80000)
        proc, kube, config = two_pod_node(tmp, mps_binary, restart_policy)
        return cls(gpus, proc, kube, config, tmp)

    def agent(self, kube: Any = None, doors: Sequence[DoorFactory] = (), checks: NodeChecks = NO_CHECKS,
              **changes: Any) -> Agent:
        """An agent of this node's settings changed by `changes`, on `kube` (default: the node's API), with its front
        `doors` and node `checks`; not started."""
        return Agent(replace(self.config, **changes), self.kube if kube is None else kube, NvmlSource(),
                     AgentMetrics(node=self.config.node), doors=doors, checks=checks)

    def start_agent(self, doors: Sequence[DoorFactory] = (), checks: NodeChecks = NO_CHECKS,
                    **changes: Any) -> Agent:
        """An agent started, its pods synced; it stops when the node closes."""
        agent = self.agent(doors=doors, checks=checks, **changes)
        agent.start()
        agent.pods.synced.wait(10)
        self.started.append(agent)
        return agent

    def close(self) -> None:
        for agent in self.started:
            agent.shutdown()

class PlacedDoor(HoldsNothing):
    """A front door that placed `tenants`, as the DRA door places its prepared claims: how a test hands the agent
    claims without a driver."""

    def __init__(self, tenants: ClaimTenants) -> None:
        self._tenants = tenants

    def tenants(self) -> ClaimTenants:
        return self._tenants

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def placing(tenants: ClaimTenants) -> DoorFactory:
    return lambda node: PlacedDoor(tenants)


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
