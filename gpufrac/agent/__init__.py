"""gpufrac node agent: node labels, MPS supervision, pod audit, per-fraction metrics (docs/architecture.md,
"One agent tick").

Decisions are pure functions over the dataclasses in `model`; NVML (`nvml`), /proc (`procfs`), subprocesses
(`supervisor`) and the Kubernetes API (`kube`, `podwatch`) stay at the edges.
"""
