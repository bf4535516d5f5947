"""The agent's NRI plugin (gpufrac.agent.nri.plugin) run in a thread for a test, against the runtime stand-in
(testkit.nri_runtime) or a real containerd, with a sink that records its decisions and states."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from gpufrac.agent.nri.config import NriConfig
from gpufrac.agent.nri.decide.creation import ContainerInfo, Injection, NodeFacts, PodInfo, Refusal
from gpufrac.agent.nri.decide.sweep import Unserved
from gpufrac.agent.nri.plugin import NriPlugin, PluginState


@dataclass
class RecordingSink:
    """What the plugin reports: each container's decision (by container ID) and each state it passes."""

    decisions: list[tuple[str, Injection | Refusal]] = field(default_factory=list)
    states: list[PluginState] = field(default_factory=list)
    unserved: list[Unserved] = field(default_factory=list)  # fractions created while the plugin was away (swept)

    def decided(self, pod: PodInfo, container: ContainerInfo, result: Injection | Refusal) -> None:
        self.decisions.append((container.id, result))

    def state_changed(self, state: PluginState) -> None:
        self.states.append(state)

    def swept(self, found: Unserved) -> None:
        self.unserved.append(found)


def start_plugin(config: NriConfig, sink: RecordingSink,
                 facts: NodeFacts | None = None) -> tuple[NriPlugin, threading.Event, threading.Thread]:
    """The plugin's loop in a thread (it connects, registers, and reconnects as it would in the agent)."""
    plugin = NriPlugin(config, lambda: facts or NodeFacts(), sink)
    stop = threading.Event()
    thread = threading.Thread(target=plugin.run, args=(stop,), daemon=True)
    thread.start()
    return plugin, stop, thread


def halt_plugin(plugin: NriPlugin, stop: threading.Event, thread: threading.Thread) -> None:
    """Stop the loop and its session; the thread must end."""
    stop.set()
    plugin.stop()
    thread.join(10)
    assert not thread.is_alive()
