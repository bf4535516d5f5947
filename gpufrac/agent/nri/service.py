"""The NRI plugin inside the agent: node facts from the agent's last tick, decisions to metrics and Events.

Two threads: the plugin's connection (registered once the agent has ticked, so it knows what the node enforces)
and the Events' sender, so a slow API server never delays an answer to the runtime.
"""

from __future__ import annotations

import logging
import queue
import threading
from pathlib import Path

from gpufrac.agent.decide.capabilities import NRI_UNAVAILABLE
from gpufrac.agent.decide.events import EventSink, refusal_event
from gpufrac.agent.decide.gpu_stack import VOIDED_DAEMONSET_REASON, daemonset_pod, voided_daemonset_message
from gpufrac.agent.decide.mps_config import multi_user_modes
from gpufrac.agent.decide.request_fit import owed_by_gpu
from gpufrac.agent.decide.runtime_support import DeliveryFacts
from gpufrac.agent.edges.cdi_specs import CdiSpecs, gpu_device_nodes
from gpufrac.agent.edges.metrics import AgentMetrics
from gpufrac.agent.edges.node_facts_watch import RuntimeWatch
from gpufrac.agent.node.doors import DoorReport, HoldsNothing, NodeView
from gpufrac.agent.nri.config import NriConfig
from gpufrac.agent.nri.decide.creation import (
    ContainerInfo,
    Injection,
    NodeFacts,
    Outcome,
    PodInfo,
    Refusal,
    ServingContainer,
)
from gpufrac.agent.nri.decide.sweep import REASON, Unserved
from gpufrac.agent.nri.plugin import NriPlugin, PluginState
from gpufrac.core.annotations import ComputeMode

log = logging.getLogger(__name__)

SWEPT = "stopped-created-without-plugin"  # the containers metric's outcome for a fraction the sweep stopped

EVENT_QUEUE = 256  # refusals waiting for the API server; more are logged, not queued


class NriService(HoldsNothing):
    def __init__(self, config: NriConfig, node: NodeView, events: EventSink, metrics: AgentMetrics, *,
                 cdi: CdiSpecs | None = None, dev_root: Path = Path("/dev"), watch_runtime: bool = False) -> None:
        self.node = node
        self._config = config
        self._events = events
        self._metrics = metrics
        self._cdi = cdi or CdiSpecs()
        self._dev_root = dev_root
        self._queue: queue.Queue[dict[str, object] | None] = queue.Queue(EVENT_QUEUE)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.plugin = NriPlugin(config, self.facts, self, hold=self.hold, route=self.route)
        for outcome in [*Outcome, SWEPT]:
            metrics.nri_containers.labels(outcome=str(outcome))
        self.state_changed(self.plugin.state)
        # the delivery path's problems (containerd < 2.1, a GPU without CDI spec), checked at each tick
        self._runtime = RuntimeWatch(node.config.node, self._cdi, lambda: self.plugin.runtime, self._no_socket,
                                     lambda: node.inventory, metrics, events) if watch_runtime else None

    def facts(self) -> NodeFacts:
        inventory = self.node.inventory
        gpus = inventory.gpus if inventory is not None else ()
        runtime = self.plugin.runtime  # as the runtime named itself in Configure; "" before the first registration
        return NodeFacts(gpus, self._cdi.names(), gpu_device_nodes(gpus, self._dev_root), dict(self.node.not_served),
                         delivery=DeliveryFacts(runtime) if runtime else None, dra_gpus=self.node.door_gpus(),
                         multi_user_modes=multi_user_modes(inventory),
                         usable_mib=self.node.usable_mib(),
                         owed=owed_by_gpu(self.node.placed(), gpus) if self.node.pods_synced() else {},
                         claim_holders=self.node.claim_holders())

    def hold(self, pod: PodInfo, serving: ServingContainer, within_s: float) -> str | None:
        """An sm-sharing fraction's limits told to the MPS daemon before its creation is answered (Agent.hold_now)."""
        if serving.mode is not ComputeMode.SM_SHARING:
            return None  # time-slicing: the toolkit's hook sets its cgroup limit as the container starts
        metadata = {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid, "annotations": dict(pod.annotations)}
        return self.node.hold_now({"metadata": metadata}, within_s)

    def route(self, pod: PodInfo, serving: ServingContainer) -> str | None:
        """The host directory of an sm-sharing fraction's own MPS namespace (Agent.pipe_route), None: none."""
        if serving.mode is not ComputeMode.SM_SHARING:
            return None
        found = self.node.pipe_route(pod.uid, serving.container)
        return str(found) if found is not None else None

    # ---- the plugin's DecisionSink ----

    def decided(self, pod: PodInfo, container: ContainerInfo, result: Injection | Refusal) -> None:
        self._metrics.nri_containers.labels(outcome=str(result.outcome)).inc()
        if result.outcome in (Outcome.VOIDED, Outcome.REFUSED):
            self._daemonset_pod(pod, container, result)
        if isinstance(result, Injection):
            if result.outcome is not Outcome.UNTOUCHED:
                log.info("NRI: %s/%s container %s: %s", pod.namespace, pod.name, container.name, result.note)
            return
        log.warning("NRI refused %s/%s container %s: %s", pod.namespace, pod.name, container.name, result.message)
        self._queue_event(refusal_event(self.node.config.node, pod.namespace, pod.name, pod.uid, container.name,
                                        str(result.reason), result.message))

    def _daemonset_pod(self, pod: PodInfo, container: ContainerInfo, result: Injection | Refusal) -> None:
        """A DaemonSet's pod voided or refused: likely a GPU stack gpufrac did not recognise (metric, Event, alert)."""
        if not daemonset_pod(pod.labels):
            return
        self._metrics.nri_daemonset_pods.labels(outcome=str(result.outcome)).inc()
        if isinstance(result, Injection):  # a refusal has its own Event
            log.warning("NRI voided the GPU env of %s/%s container %s, a DaemonSet's pod", pod.namespace, pod.name,
                        container.name)
            self._queue_event(refusal_event(self.node.config.node, pod.namespace, pod.name, pod.uid, container.name,
                                            VOIDED_DAEMONSET_REASON,
                                            voided_daemonset_message(container.name, result.note),
                                            label="gpufrac.io/voided"))

    def _queue_event(self, event: dict[str, object]) -> None:
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            log.warning("too many Events waiting for the API server; this one is only logged")

    def swept(self, found: Unserved) -> None:
        self._metrics.nri_containers.labels(outcome=SWEPT).inc()
        self._queue_event(refusal_event(self.node.config.node, found.pod.namespace, found.pod.name, found.pod.uid,
                                        found.container.name, REASON, found.message))

    def state_changed(self, state: PluginState) -> None:
        for each in PluginState:
            self._metrics.nri_state.labels(state=str(each)).set(1 if each is state else 0)
        if state is PluginState.REGISTERED:
            self._metrics.nri_registrations.inc()

    def problem(self) -> str | None:
        """Why GPUs do not reach containers through the plugin now (the node condition's message), None if they do."""
        state = self.plugin.state
        if state is PluginState.NO_SOCKET:
            return (f"the container runtime has no NRI socket at {self.plugin.config.socket_path} (containerd 1.x, "
                    "or NRI disabled): the agent's NRI plugin hands out no devices, so fractional containers get "
                    "their GPU through NVIDIA_VISIBLE_DEVICES only, which any pod on the node can also set; enable NRI "
                    "(containerd 2.x) or see docs/install.md")
        if state is PluginState.WAITING_LOCK:
            return (f"another gpufrac NRI plugin holds {self.plugin.config.lock_file} on this node; this agent "
                    "registers once it stops")
        return None

    def _no_socket(self) -> str | None:
        """The runtime has no NRI (not: another agent holds the lock for a moment)."""
        return self.problem() if self.plugin.state is PluginState.NO_SOCKET else None

    def no_nri(self) -> tuple[str, str] | None:
        """The runtime has no NRI: without the env fallback the node is not Ready for fractions."""
        if self.plugin.state is not PluginState.NO_SOCKET:
            return None
        return (NRI_UNAVAILABLE, f"{self.problem()}; so the node is not Ready for fractions (set the chart's "
                                 "nri.envFallback=true to accept the env var alone)")

    # ---- the door (node.doors.FrontDoor) ----

    def report(self) -> DoorReport:
        blocking = self.no_nri() if not self._config.env_fallback else None
        return DoorReport(delivery=self.problem(), runtime=tuple(self._runtime()) if self._runtime else (),
                          blocking=(blocking,) if blocking else ())

    # ---- threads ----

    def start(self) -> None:
        self._threads = [
            threading.Thread(target=self._run_plugin, name="nri-plugin", daemon=True),
            threading.Thread(target=self._send_events, name="nri-events", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self.plugin.stop()
        try:
            self._queue.put(None, timeout=timeout)  # behind the Events still waiting
        except queue.Full:
            log.warning("refusal Events still waiting for the API server at stop are dropped")
        for thread in self._threads:
            thread.join(timeout)

    def _run_plugin(self) -> None:
        while not self._stop.is_set() and not self.node.ticked.wait(0.2):
            pass
        if not self._stop.is_set():
            self.plugin.run(self._stop)

    def _send_events(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            metadata = event["metadata"]
            assert isinstance(metadata, dict)
            try:
                self._events.create_event(str(metadata["namespace"]), event)
            except Exception as err:  # an Event is worth a warning, not a lost plugin
                log.warning("recording the refusal Event %s: %s", metadata["name"], err)
