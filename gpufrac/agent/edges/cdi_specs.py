"""What the node has to hand out: the CDI devices its specs name, and its GPU device nodes. Reads files.

containerd resolves CDI names against its CRI `cdi_spec_dirs` (default /etc/cdi and /var/run/cdi); the agent reads
the same directories (mounted read-only) so that it hands out a CDI name only where containerd can resolve it.
Specs are JSON or YAML (NVIDIA's toolkit writes either); one is parsed again only when its file changed.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpufrac.agent.decide.device_nodes import CONTROL_DEVICES, GPU_DEVICE_PREFIX, DeviceNode
from gpufrac.agent.decide.model import GpuInfo

log = logging.getLogger(__name__)

DEFAULT_CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
SPEC_SUFFIXES = (".json", ".yaml", ".yml")


def spec_device_names(spec: Any) -> list[str]:
    """The fully qualified names (`vendor.com/class=name`) one CDI spec defines. ValueError for a bad shape."""
    if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str) or "/" not in spec["kind"]:
        raise ValueError("a CDI spec needs a `kind` of the form vendor.com/class")
    devices = spec.get("devices")
    if not isinstance(devices, list):
        raise ValueError("a CDI spec needs a `devices` list")
    names = [d.get("name") for d in devices if isinstance(d, dict)]
    if not all(isinstance(n, str) and n for n in names):
        raise ValueError("every CDI device needs a `name`")
    return [f"{spec['kind']}={name}" for name in names]


class CdiSpecs:
    """The CDI device names in the spec directories, parsed once per file version (path, mtime, size)."""

    def __init__(self, dirs: Sequence[Path] = DEFAULT_CDI_DIRS) -> None:
        self.dirs = tuple(dirs)
        self._parsed: dict[Path, tuple[tuple[int, int], tuple[str, ...]]] = {}

    def names(self) -> frozenset[str]:
        seen: dict[Path, tuple[str, ...]] = {}
        for path in self._spec_files():
            try:
                info = path.stat()
            except OSError:
                continue
            version = (info.st_mtime_ns, info.st_size)
            cached = self._parsed.get(path)
            if cached is None or cached[0] != version:
                cached = (version, self._parse(path))
                self._parsed[path] = cached
            seen[path] = cached[1]
        self._parsed = {p: v for p, v in self._parsed.items() if p in seen}
        return frozenset(name for names in seen.values() for name in names)

    def _spec_files(self) -> Iterable[Path]:
        for directory in self.dirs:
            try:
                entries = sorted(directory.iterdir())
            except OSError:
                continue
            yield from (p for p in entries if p.suffix in SPEC_SUFFIXES)

    @staticmethod
    def _parse(path: Path) -> tuple[str, ...]:
        try:
            text = path.read_text()
            spec = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
            return tuple(spec_device_names(spec))
        except (OSError, ValueError, yaml.YAMLError) as err:
            log.warning("CDI spec %s is not usable, its devices are not handed out: %s", path, err)
            return ()


def device_node(path: Path, name: str | None = None) -> DeviceNode | None:
    """The character device at `path` on this host (None: absent, or not a character device)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISCHR(info.st_mode):
        return None
    return DeviceNode(name or str(path), os.major(info.st_rdev), os.minor(info.st_rdev), stat.S_IMODE(info.st_mode))


def gpu_device_nodes(gpus: Iterable[GpuInfo], dev_root: Path = Path("/dev")) -> dict[str, DeviceNode]:
    """The GPUs' /dev/nvidia<index> and the control devices this host has, by their path in a container."""
    paths = [f"{GPU_DEVICE_PREFIX}{gpu.index}" for gpu in gpus] + list(CONTROL_DEVICES)
    nodes = {}
    for path in paths:
        node = device_node(dev_root / path.removeprefix("/dev/"), path)
        if node is not None:
            nodes[path] = node
    return nodes
