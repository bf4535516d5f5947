"""Who wrote a CDI spec and whether it runs the toolkit's memory-limit hook, from the parsed spec. Pure.

NVIDIA's device plugin writes its own kind (`k8s.device-plugin.nvidia.com/gpu`); the toolkit (`nvidia-ctk cdi
generate`, the GPU Operator) writes `nvidia.com/gpu` with hooks run by `nvidia-cdi-hook` (older toolkits: `nvidia-ctk
hook ...`); gpufrac's own would be under `gpufrac.io/`. Anything else was written by hand or by another tool.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from typing import Any

from gpufrac.agent.decide.node_check import MEMORY_LIMIT_HOOK, Author, CdiSpecFacts

TOOLKIT_HOOK_BINARIES = ("nvidia-cdi-hook", "nvidia-ctk")


def _edits(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The spec's container edits, its own and each device's."""
    edits = spec.get("containerEdits")
    if isinstance(edits, dict):
        yield edits
    for device in spec.get("devices") or ():
        if isinstance(device, dict) and isinstance(device.get("containerEdits"), dict):
            yield device["containerEdits"]


def _hooks(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for edits in _edits(spec):
        yield from (h for h in edits.get("hooks") or () if isinstance(h, dict))


def _runs_toolkit(hook: dict[str, Any]) -> bool:
    args = hook.get("args") or []
    names = [posixpath.basename(str(hook.get("path", "")))] + [str(a) for a in args[:1]]
    return any(name in TOOLKIT_HOOK_BINARIES for name in names)


def author(spec: dict[str, Any]) -> Author:
    kind = str(spec.get("kind", ""))
    if kind.startswith("k8s.device-plugin.nvidia.com/"):
        return Author.DEVICE_PLUGIN
    if kind.startswith("gpufrac.io/"):
        return Author.GPUFRAC
    if any(_runs_toolkit(hook) for hook in _hooks(spec)):
        return Author.TOOLKIT
    return Author.OTHER


def has_memory_limit_hook(spec: dict[str, Any]) -> bool:
    return any(MEMORY_LIMIT_HOOK in [str(a) for a in hook.get("args") or ()] for hook in _hooks(spec))


def describe(path: str, spec: dict[str, Any], devices: list[str]) -> CdiSpecFacts:
    """What node-check says of one parsed spec, given the device names it defines."""
    return CdiSpecFacts(path, str(spec.get("kind", "")), tuple(devices), author(spec), has_memory_limit_hook(spec))
