"""A real containerd 2 with its CRI, NRI and CDI on (e2e.toolkit.cri_node), for tests that drive it with crictl as a
kubelet would, and the agent's NRI plugin registered with it in a thread."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from e2e.node import GPU_UUIDS, IMAGES_DIR, PAUSE_IMAGE
from e2e.toolkit.cri_node import CriNode
from e2e.toolkit.tools import find_binary
from e2e.toolkit.wait import wait_until
from gpufrac.agent.decide.model import GpuInfo
from gpufrac.agent.edges.cdi_specs import CdiSpecs
from gpufrac.agent.nri.config import NriConfig
from gpufrac.agent.nri.decide.creation import NodeFacts
from gpufrac.agent.nri.plugin import NriPlugin, PluginState
from gpufrac.core.annotations import ComputeMode


def crictl() -> str | None:
    return os.environ.get("GPUFRAC_CRICTL") or find_binary("crictl") or shutil.which("crictl")


def missing() -> str | None:
    """Why a CRI node cannot run here (for a test to skip with), None when it can."""
    binaries = [name for name in ("containerd", "containerd-shim-runc-v2", "ctr", "runc") if not find_binary(name)]
    if os.geteuid() != 0 or binaries:
        return f"needs root and the tools cache's containerd 2 and runc (`make tools`); missing {binaries}"
    if crictl() is None:
        return "needs crictl (`make tools`, or GPUFRAC_CRICTL)"
    if any(not (IMAGES_DIR / a).is_file() for a in ("pause.oci.tar", "app.oci.tar")):
        return "needs the local images (`make image`)"
    return None


@contextmanager
def started_cri_node(tag: str, skip: Callable[[str], Any], *, nri_required_plugins: Sequence[str] = (),
                     nri_tolerate_annotation: str = "") -> Iterator[CriNode]:
    """The node, started; stopped, its pods removed, on leaving. Where it cannot run here, `skip(why)` (a test's
    pytest.skip) is called instead. `nri_required_plugins`: containerd's NRI default validator requires them."""
    why = missing()
    if why:
        skip(why)
        raise RuntimeError(why)  # a skip that returned
    # a short path: a unix socket's path must stay under 108 bytes
    root = Path(f"/tmp/gpufrac-{tag}-{os.getpid()}-{time.monotonic_ns() % 100000}")
    node = CriNode(root, PAUSE_IMAGE, GPU_UUIDS, nri_required_plugins=nri_required_plugins,
                   nri_tolerate_annotation=nri_tolerate_annotation)
    try:
        node.start(IMAGES_DIR)
        yield node
    finally:
        node.stop(crictl())
        subprocess.run(["rm", "-rf", str(root)], check=False)


@contextmanager
def registered_plugin(node: CriNode, sink: Any, name: str, lock_file: Path | None = None) -> Iterator[NriPlugin]:
    """The agent's NRI plugin registered with the node's containerd, deciding with the node's GPUs and CDI specs;
    stopped (its thread ended) on leaving."""
    gpus = tuple(GpuInfo(i, u, "NVIDIA H200", 143771 << 20) for i, u in enumerate(GPU_UUIDS))
    cdi = CdiSpecs([node.cdi_dir])
    plugin = NriPlugin(NriConfig(node.nri_socket, name=name, lock_file=lock_file),
                       lambda: NodeFacts(gpus, cdi.names(), {}, dict.fromkeys(ComputeMode)), sink)
    stop = threading.Event()
    thread = threading.Thread(target=plugin.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: plugin.state is PluginState.REGISTERED, 60, "the plugin registered", interval=0.1)
        yield plugin
    finally:
        stop.set()
        plugin.stop()
        thread.join(10)
