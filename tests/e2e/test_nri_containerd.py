"""The agent's NRI plugin against a real containerd 2.4.2 (the tools cache's, `make tools`), alone: no kubelet, no
pods. containerd starts with its CRI and NRI plugins on a socket of this test's own, and the plugin (NriPlugin, the
wire session) registers, is configured and synchronized, reconnects at once when containerd restarts, and a second
instance of it waits for the first. Container creation through NRI is in tests/node/test_nri_real_node.py."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.toolkit.containerd import daemon_config
from e2e.toolkit.tools import find_binary
from e2e.toolkit.wait import wait_until
from gpufrac.agent.nri.config import NriConfig
from gpufrac.agent.nri.plugin import PluginState
from testkit.nri_plugin import RecordingSink, halt_plugin, start_plugin

pytestmark = pytest.mark.e2e



class Containerd:
    def __init__(self, binary: str, root: Path) -> None:
        self.binary, self.root = binary, root
        self.nri_socket = root / "nri" / "nri.sock"
        self.config = root / "config.toml"
        self.log = root / "containerd.log"
        self.config.parent.mkdir(parents=True, exist_ok=True)
        # NRI on, and containerd's debug log to read what it did.
        self.config.write_text(f"""{daemon_config(root, root / 'run' / 'containerd.sock', debug_level='debug')}
[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = '{self.nri_socket}'
""")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([self.binary, "--config", str(self.config)], stdout=self.log.open("ab"),
                                     stderr=subprocess.STDOUT)
        wait_until(lambda: self.nri_socket.is_socket(), 60, "containerd's NRI socket", interval=0.1)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(30)
            self.proc = None

    def logged(self, text: str) -> bool:
        return text in self.log.read_text(errors="replace")


@pytest.fixture
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    binary = find_binary("containerd") or os.environ.get("GPUFRAC_CONTAINERD")
    if not binary or os.geteuid() != 0:
        pytest.skip("needs root and containerd 2 in the tools cache (`make tools`)")
    # a short path: a unix socket's path must stay under 108 bytes
    root = Path(f"/tmp/gpufrac-nri-{os.getpid()}-{time.monotonic_ns() % 100000}")
    daemon = Containerd(binary, root)
    daemon.start()
    yield daemon
    daemon.stop()
    subprocess.run(["rm", "-rf", str(root)], check=False)




def test_the_plugin_registers_with_containerd_and_comes_back_after_a_restart(containerd: Containerd,
                                                                              tmp_path: Path):
    sink = RecordingSink()
    plugin, stop, thread = start_plugin(NriConfig(containerd.nri_socket, lock_file=tmp_path / "lock",
                                                retry_interval=0.2), sink)
    try:
        wait_until(lambda: plugin.state is PluginState.REGISTERED, 30, "the plugin registered", interval=0.05)
        assert plugin.runtime.startswith("containerd") and "2.4.2" in plugin.runtime, plugin.runtime
        # containerd's own account: the plugin connected as <index>-<name>, and was synchronized
        wait_until(lambda: containerd.logged("10-gpufrac"), 10, "containerd to log the plugin", interval=0.1)
        containerd.stop()
        wait_until(lambda: plugin.state is not PluginState.REGISTERED, 10, "the plugin to see the socket close",
                   interval=0.05)
        containerd.start()
        wait_until(lambda: plugin.state is PluginState.REGISTERED and plugin.sessions >= 2, 30,
                   "the plugin registered again", interval=0.05)
    finally:
        halt_plugin(plugin, stop, thread)


def test_a_second_instance_waits_while_the_first_is_registered(containerd: Containerd, tmp_path: Path):
    config = NriConfig(containerd.nri_socket, lock_file=tmp_path / "lock")
    running = [start_plugin(config, RecordingSink())]
    first = running[0]
    try:
        # the first holds the lock before the second starts: started together, either may win it
        wait_until(lambda: first[0].state is PluginState.REGISTERED, 30, "the first registered", interval=0.05)
        second = start_plugin(config, RecordingSink())
        running.append(second)
        wait_until(lambda: second[0].state is PluginState.WAITING_LOCK, 10, "the second waiting", interval=0.05)
        halt_plugin(*running.pop(0))
        wait_until(lambda: second[0].state is PluginState.REGISTERED, 30, "the second registered", interval=0.05)
    finally:
        for plugin in running:
            halt_plugin(*plugin)
