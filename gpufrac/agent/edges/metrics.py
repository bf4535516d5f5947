"""Prometheus metrics in the agent's own registry, all prefixed `gpufrac_`.

Named to join with NVIDIA's DCGM exporter: the GPU is the `UUID` label and the node the `Hostname` label, as
DCGM writes them, and fractions of a whole are `_ratio` (0-1). No `_created` series.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Info, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpufrac.agent.decide.capacity import Usable
from gpufrac.agent.decide.model import UsageSample, ViolationKind
from gpufrac.agent.decide.runtime_support import METRIC_REASONS
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.buildinfo import build_info

USAGE_LABELS = ("namespace", "pod", "container", "UUID", "Hostname")

# Counters answer with their `_total` alone: `_created` doubles the series and nothing here reads it.
disable_created_metrics()  # type: ignore[no-untyped-call]


class _UsageCollector(Collector):
    """Per-fraction series from the latest snapshot: series of pods that are gone disappear with it."""

    def __init__(self, node: str) -> None:
        self._node = node
        self._lock = threading.Lock()
        self._samples: tuple[UsageSample, ...] = ()

    def set(self, samples: Iterable[UsageSample]) -> None:
        with self._lock:
            self._samples = tuple(samples)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            samples = self._samples
        families = {
            "used": GaugeMetricFamily(
                "gpufrac_container_gpu_memory_used_bytes",
                "GPU memory used by the container's processes on this GPU (NVML)",
                labels=USAGE_LABELS,
            ),
            "limit": GaugeMetricFamily(
                "gpufrac_container_gpu_memory_limit_bytes",
                "The container's GPU memory limit per device (gpu-memory.limit-mib)",
                labels=USAGE_LABELS,
            ),
            "util": GaugeMetricFamily(
                "gpufrac_container_gpu_sm_utilization_ratio",
                "SM utilization of the container's processes on this GPU, 0-1 (NVML)",
                labels=USAGE_LABELS,
            ),
            "norm": GaugeMetricFamily(
                "gpufrac_container_gpu_sm_utilization_normalized_ratio",
                "SM utilization divided by the container's fraction of the GPU "
                "(request MiB / GPU memory), 0-1 (capped at 1)",
                labels=USAGE_LABELS,
            ),
        }
        for s in samples:
            labels = [s.namespace, s.pod, s.container, s.gpu_uuid, self._node]
            families["used"].add_metric(labels, s.used_bytes)
            if s.limit_bytes is not None:
                families["limit"].add_metric(labels, s.limit_bytes)
            families["util"].add_metric(labels, s.sm_util / 100)  # the audit works in percent
            families["norm"].add_metric(labels, s.sm_util_normalized / 100)
        yield from families.values()


RECLAIM_OUTCOMES = ("evicted", "blocked", "failed", "not-kept-off", "unread", "would-evict", "no-candidate",
                    "driver-ended")
OVER_LIMIT_OUTCOMES = (("kill-newest", "killed"), ("evict", "evicted"), ("evict", "blocked"))
GPU_LABELS = ("UUID", "Hostname", "modelName")


class _GpuMemoryCollector(Collector):
    """Per GPU, from the latest pass: usable memory, the driver's reserve, and the guarantee's shortfall."""

    def __init__(self, node: str) -> None:
        self._node = node
        self._lock = threading.Lock()
        self._usable: tuple[Usable, ...] = ()
        self._shortfall: dict[str, int] = {}

    def set(self, usable: Iterable[Usable], shortfall: dict[str, int]) -> None:
        with self._lock:
            self._usable = tuple(usable)
            self._shortfall = dict(shortfall)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            usable, shortfall = self._usable, self._shortfall
        families = {
            "usable": GaugeMetricFamily(
                "gpufrac_gpu_memory_usable_bytes",
                "GPU memory workloads can use: NVML's total minus the driver's reserve and the MPS server's context",
                labels=GPU_LABELS,
            ),
            "reserved": GaugeMetricFamily(
                "gpufrac_gpu_memory_reserved_bytes",
                "GPU memory the driver keeps (NVML v2 memory info's reserved)",
                labels=GPU_LABELS,
            ),
            "shortfall": GaugeMetricFamily(
                "gpufrac_gpu_memory_guarantee_shortfall_bytes",
                "Memory still owed to containers below their requests minus the free memory, when positive: "
                "their requests do not fit until memory above other requests is reclaimed",
                labels=GPU_LABELS,
            ),
        }
        for item in usable:
            labels = [item.gpu.uuid, self._node, item.gpu.name]
            families["usable"].add_metric(labels, item.usable_bytes)
            families["reserved"].add_metric(labels, item.reserved_bytes)
            families["shortfall"].add_metric(labels, max(0, shortfall.get(item.gpu.uuid, 0)))
        yield from families.values()


class AgentMetrics:
    def __init__(self, node: str = "") -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.usage = _UsageCollector(node)
        self.registry.register(self.usage)
        info = Info("gpufrac_build", "The running gpufrac: version and Python", registry=self.registry)
        info.info({**build_info(), "component": "agent"})
        # Only modes the agent runs a daemon for have a series: 0 means down, not "not served here".
        self.daemon_up = Gauge(
            "gpufrac_mps_daemon_up",
            "1 while the mode's MPS control daemon runs and has its control socket",
            ["mode"],
            registry=self.registry,
        )
        self.version_skew = Gauge(
            "gpufrac_mps_version_skew",
            "1 while the mode's MPS daemon runs under another gpufrac build (version and image) than the agent: an "
            "MPS pod an upgrade left behind (the DaemonSet is OnDelete); 0 when they match",
            ["mode"],
            registry=self.registry,
        )
        self.webhook_skew = Gauge(
            "gpufrac_webhook_version_skew",
            "1 while the release's webhook runs another major.minor than this agent (the skew rule: they must "
            "match; a helm upgrade rolls both); 0 when they match or the webhook's version is not known",
            registry=self.registry,
        )
        self.unplaceable_fractions = Gauge(
            "gpufrac_unplaceable_fractions",
            "Fractional pods no node has that are time-slicing only because they name no mode, while no node serves "
            "time-slicing (each has the Event NoNodeServesTimeSlicing): as this agent last saw them, where its driver "
            "cannot serve time-slicing; 0 elsewhere",
            registry=self.registry,
        )
        self.daemon_restarts = Counter(
            "gpufrac_mps_daemon_restarts",
            "Restarts of the mode's MPS control daemon after it exited unexpectedly",
            ["mode"],
            registry=self.registry,
        )
        self.violations = Counter(
            "gpufrac_violations",
            "Violations found by the audit (each counted once when first seen)",
            ["kind"],
            registry=self.registry,
        )
        self.watch_reconnects = Counter(
            "gpufrac_watch_reconnects",
            "Times the pod watch was re-established (disconnects and 410 Gone relists)",
            registry=self.registry,
        )
        self.nvml_up = Gauge(
            "gpufrac_nvml_up", "1 when the last NVML query succeeded", registry=self.registry
        )
        self.enforcement = Gauge(
            "gpufrac_node_enforcement",
            "1 for the enforcement each mode has on this node",
            ["mode", "enforcement"],
            registry=self.registry,
        )
        self.unreadable_canonical = Gauge(
            "gpufrac_unreadable_canonical_containers",
            "Fractional containers on this node whose gpufrac.io/ annotations do not parse, so they are not "
            "audited (the agent log names the annotation)",
            registry=self.registry,
        )
        self.gpu_memory = _GpuMemoryCollector(node)
        self.registry.register(self.gpu_memory)
        self.containers_over_limit = Gauge(
            "gpufrac_containers_over_limit",
            "Fractional containers whose GPU processes together use more memory than the container's limit on a "
            "GPU, now (one per container and GPU)",
            registry=self.registry,
        )
        self.over_limit_actions = Counter(
            "gpufrac_over_limit_actions",
            "What enforcement.overLimitAction did to containers over their limit: the newest process killed, the "
            "pod evicted, or its eviction refused (a PodDisruptionBudget)",
            ["action", "outcome"],
            registry=self.registry,
        )
        self.reclaims = Counter(
            "gpufrac_reclaims",
            "Reclaim of memory used above a request, per pod considered: evicted, blocked (a PodDisruptionBudget "
            "refused), failed, not-kept-off (its back-off label not written: not evicted), unread (a claim's pod not "
            "read: not evicted), would-evict (reclaim.policy off), no-candidate (nothing above its request), "
            "driver-ended (a process above its request gone where the driver holds requests)",
            ["outcome"],
            registry=self.registry,
        )
        self.reclaimed_bytes = Counter(
            "gpufrac_reclaimed_bytes",
            "GPU memory the pods evicted by reclaim used on the contended GPU",
            registry=self.registry,
        )
        for outcome in RECLAIM_OUTCOMES:
            self.reclaims.labels(outcome=outcome)
        for action, outcome in OVER_LIMIT_OUTCOMES:
            self.over_limit_actions.labels(action=action, outcome=outcome)
        self.nri_containers = Counter(
            "gpufrac_nri_containers",
            "Containers the NRI plugin decided on at creation, by outcome: injected (a fraction got its GPU "
            "devices), voided (another container's GPU env grant was voided), untouched, refused; and "
            "stopped-created-without-plugin: a fraction created while the plugin was away, stopped once it was back",
            ["outcome"],
            registry=self.registry,
        )
        self.nri_daemonset_pods = Counter(
            "gpufrac_nri_daemonset_pods",
            "Containers of DaemonSet pods whose GPU env the NRI plugin voided or whose creation it refused, by "
            "outcome (voided, refused): node-wide components such as a device plugin or a DCGM exporter lose their "
            "GPUs; add their namespace to nri.trustedNamespaces",
            ["outcome"],
            registry=self.registry,
        )
        self.nri_state = Gauge(
            "gpufrac_nri_plugin_state",
            "1 for the NRI plugin's state: registered; no-socket (containerd 1.x or NRI disabled: GPUs reach "
            "containers through NVIDIA_VISIBLE_DEVICES only); waiting-lock; connecting; starting; stopped",
            ["state"],
            registry=self.registry,
        )
        self.nri_registrations = Counter(
            "gpufrac_nri_registrations",
            "Times the NRI plugin registered with the runtime (the first, then one per reconnection)",
            registry=self.registry,
        )
        self.runtime_problem = Gauge(
            "gpufrac_node_runtime_problem",
            "1 while the node's runtime cannot deliver fractions as it should, by reason: ContainerdTooOld "
            "(containerd before 2.1 drops NRI plugins' CDI devices) and NoCdiSpecForGpu (a GPU no CDI spec names), "
            "where fractions get no working GPU and the node condition is False; NriUnavailable (no NRI socket: "
            "GPUs reach fractions by the env var any pod may set). 0 with the NRI plugin off",
            ["reason"],
            registry=self.registry,
        )
        for reason in METRIC_REASONS:
            self.runtime_problem.labels(reason=reason)
        for outcome in ("voided", "refused"):  # the NRI decision's outcomes (Outcome.VOIDED, Outcome.REFUSED)
            self.nri_daemonset_pods.labels(outcome=outcome)
        for mode in ComputeMode:
            self.daemon_restarts.labels(mode=str(mode))
        for kind in ViolationKind:
            self.violations.labels(kind=str(kind))

    def set_usage(self, samples: Sequence[UsageSample]) -> None:
        self.usage.set(samples)
