"""gpufrac node agent (DESIGN §3): node labels, MPS supervision, pod audit, per-fraction metrics.

Decisions are pure functions over the dataclasses in `model`; NVML (`nvml`), /proc (`procfs`), subprocesses
(`supervisor`) and the Kubernetes API (`kube`, `podwatch`) stay at the edges.
"""
