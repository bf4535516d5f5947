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

from gpufrac.agent.model import UsageSample, ViolationKind
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
        for mode in ComputeMode:
            self.daemon_restarts.labels(mode=str(mode))
        for kind in ViolationKind:
            self.violations.labels(kind=str(kind))

    def set_usage(self, samples: Sequence[UsageSample]) -> None:
        self.usage.set(samples)
