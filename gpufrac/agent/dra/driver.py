"""The DRA driver `gpu.gpufrac.io` inside `gpufrac agent --dra`: Prepare and Unprepare for the kubelet, and the
node's ResourceSlices kept in step with its GPUs.

Crash-safe order: Prepare writes the claim's CDI spec, then records the claim in the state file; Unprepare removes
the spec, then the record. A restarted agent reads the record, answers a repeated Prepare with what it prepared
(rewriting a spec that went missing) and removes what Unprepare names, recorded or not.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpufrac.agent.decide.capacity import usable_label
from gpufrac.agent.decide.errors import ConfigError
from gpufrac.agent.decide.front_door import FrontDoorChoice, choose
from gpufrac.agent.decide.gpu_identity import gpu_identity
from gpufrac.agent.decide.model import Inventory, RunningContainer
from gpufrac.agent.dra.decide import state as dra_state
from gpufrac.agent.dra.decide.claims import ClaimError, ClaimRef, read_claim
from gpufrac.agent.dra.decide.prepare import (
    DRA_DOOR,
    DraNode,
    PreparedClaim,
    cdi_spec,
    control_devices,
    own_cdi_id,
    prepare,
)
from gpufrac.agent.dra.decide.reconcile import reconciled
from gpufrac.agent.dra.decide.slices import SliceGpu, dropped_fields, resource_slices
from gpufrac.agent.dra.files import ClaimSpecs, StateFile
from gpufrac.agent.dra.services import DeviceAnswer
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import FrontDoor
from gpufrac.kube.errors import ConflictError, KubeError, NotFoundError

log = logging.getLogger(__name__)


class SliceApi(Protocol):
    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def list_slices(self, node: str) -> list[dict[str, Any]]: ...

    def create_slice(self, body: dict[str, Any]) -> None: ...

    def replace_slice(self, body: dict[str, Any], resource_version: str) -> None: ...

    def delete_slice(self, name: str) -> None: ...

    def node_uid(self, node: str) -> str: ...


def _answers(claim: PreparedClaim) -> tuple[DeviceAnswer, ...]:
    return tuple(DeviceAnswer(d.request, d.pool, d.device, d.cdi_ids, d.share_id) for d in claim.devices)


def _claimed_gpus(claims: Iterable[PreparedClaim]) -> dict[str, str]:
    return {device.gpu_uuid: str(claim.claim) for claim in claims for device in claim.devices}


def _slice_content(body: dict[str, Any]) -> Any:
    spec = dict(body["spec"])
    spec["pool"] = {k: v for k, v in spec["pool"].items() if k != "generation"}
    return spec, body["metadata"].get("ownerReferences")


class DraDriver:
    """The kubelet's claims in, CDI specs and a state record out; one claim at a time (the record is one file)."""

    def __init__(self, node: Callable[[], DraNode | None], api: SliceApi, specs: ClaimSpecs, state: StateFile,
                 driver_version: Callable[[], str] = lambda: "",
                 hold: Callable[[], str | None] = lambda: None) -> None:
        self._node = node
        # Tells the sm-sharing daemon the node's limits now (Agent.hold_now); why it could not
        self._hold = hold
        self._api = api
        self._specs = specs
        self._state = state
        self._driver_version = driver_version
        self._lock = threading.Lock()
        self._published: list[Any] | None = None
        self._node_uid = ""
        self.api_problem: str | None = None  # what the API server dropped of the slices (dra.decide.slices)
        text = state.read()
        try:
            self.prepared: dict[str, PreparedClaim] = dra_state.load(text) if text is not None else {}
        except dra_state.StateError as err:
            raise ConfigError(f"{state.path}: {err}; the claims it recorded cannot be unprepared") from err
        self._saved = tuple(self.prepared.values())
        self._claimed = _claimed_gpus(self._saved)
        if self.prepared:
            log.info("DRA driver: %d claims prepared before this start (%s)", len(self.prepared), state.path)

    # ---- the kubelet's calls ----

    def prepare(self, claim: ClaimRef) -> tuple[DeviceAnswer, ...] | str:
        with self._lock:
            try:
                answers = self._prepare(claim)
            except (ClaimError, KubeError, OSError) as err:
                return str(err)
            prepared = self.prepared.get(claim.uid)
        if isinstance(answers, str) or prepared is None or \
                not any(d.mode == str(ComputeMode.SM_SHARING) for d in prepared.devices):
            return answers
        # Outside the lock (a pass under way may be telling the daemon): the daemon holds the share's limits before its
        # container's process connects, not from the loop's next pass; the kubelet retries a Prepare that failed.
        why_not = self._hold()
        if why_not is not None:
            return (f"claim {claim} is prepared, but the sm-sharing MPS daemon did not take its limits ({why_not}); "
                    "without them a process that drops its env would have the whole GPU")
        return answers

    def _prepare(self, claim: ClaimRef) -> tuple[DeviceAnswer, ...] | str:
        node = self._node()
        done = self.prepared.get(claim.uid)
        if done is not None:
            if any(own_cdi_id(d) for d in done.devices) and not self._specs.exists(claim.uid):
                # the spec went missing (a reboot cleared /var/run): write it again, never answer without it
                if node is None:
                    return (f"claim {claim} was prepared before the agent restarted and its CDI spec is gone (a "
                            "reboot); the agent writes it again once it has read this node's GPUs (NVML); the "
                            "kubelet retries")
                self._write_spec(done, node)
            return _answers(done)
        if node is None:
            return "the agent has not read this node's GPUs yet (NVML); the kubelet retries"
        obj = self._api.get_claim(claim.namespace, claim.name)
        uid = ((obj or {}).get("metadata") or {}).get("uid")
        if obj is None or uid != claim.uid:
            return f"claim {claim} is gone from the API server"
        result = prepare(read_claim(obj), node, self.prepared.values())
        self._write_spec(result, node)
        self.prepared[claim.uid] = result
        self._save()
        log.info("DRA prepared claim %s: %s", claim, ", ".join(
            f"{d.device} ({d.mode}, {d.request_mib} MiB, limit {d.limit_mib} MiB)" for d in result.devices))
        return _answers(result)

    def _rewrite_missing(self, claim: PreparedClaim) -> None:
        node = self._node()
        if node is not None and any(own_cdi_id(d) for d in claim.devices) and not self._specs.exists(claim.claim.uid):
            self._write_spec(claim, node)
            log.info("DRA: the CDI spec of claim %s was gone (a reboot?): written again", claim.claim)

    def _write_spec(self, claim: PreparedClaim, node: DraNode) -> None:
        spec = cdi_spec(claim, node)
        if spec is not None:
            self._specs.write(claim.claim.uid, spec)

    def unprepare(self, claim: ClaimRef) -> str | None:
        with self._lock:
            try:
                self._specs.remove(claim.uid)
                if self.prepared.pop(claim.uid, None) is not None:
                    self._save()
                    log.info("DRA unprepared claim %s", claim)
            except OSError as err:
                return f"unpreparing claim {claim}: {err}"
        return None

    def claims(self) -> tuple[PreparedClaim, ...]:
        """The claims prepared, as of the last saved change; without the lock, as `claimed_gpus`: the NRI plugin's
        creations read them (Agent.placed) within the runtime's deadline, while a Prepare may be waiting on the API
        server."""
        return self._saved

    def claimed_gpus(self) -> dict[str, str]:
        """GPU UUID -> a claim prepared on it; without the lock (the NRI plugin asks within the runtime's deadline,
        while a Prepare may be waiting on the API server): the mapping as of the last saved change."""
        return self._claimed

    def _save(self) -> None:
        self._state.write(dra_state.dump(self.prepared.values()))
        self._saved = tuple(self.prepared.values())
        self._claimed = _claimed_gpus(self._saved)

    # ---- the records, held against the API ----

    def reconcile(self) -> None:
        """Drop the records of claims gone from the API, take the pods each claim is reserved for now
        (dra.decide.reconcile) and write again the specs a reboot removed (a container the kubelet restarts needs
        it, and the kubelet does not prepare the claim again for that); one GET per recorded claim. Raises
        KubeError."""
        for record in self._saved:
            obj = self._api.get_claim(record.claim.namespace, record.claim.name)
            with self._lock:
                if self.prepared.get(record.claim.uid) is not record:
                    continue  # unprepared or prepared again meanwhile
                now = reconciled(record, obj)
                if now is not None:
                    self._rewrite_missing(now)
                if now is record:
                    continue
                if now is None:
                    self._specs.remove(record.claim.uid)
                    del self.prepared[record.claim.uid]
                    log.info("DRA: claim %s is gone from the API server; its record and CDI spec are dropped",
                             record.claim)
                else:
                    self.prepared[record.claim.uid] = now
                self._save()

    # ---- the ResourceSlices ----

    def publish(self) -> bool:
        """Make the node's slices say what its GPUs are now; True when it wrote something. Raises KubeError."""
        node = self._node()
        if node is None:
            return False
        # a node whose front door is annotations publishes no devices: the scheduler then allocates none here
        gpus = node.publishable() if node.front_door.door is FrontDoor.DRA else []
        if gpus and not self._node_uid:
            self._node_uid = self._owner_uid(node.name)
        lost = {gpu.gpu.index: node.lost[gpu.gpu.uuid] for gpu in gpus if gpu.gpu.uuid in node.lost}
        wanted = resource_slices(node.name, gpus, self._driver_version(), generation=0, offered=node.offered(),
                                 lost=lost, node_uid=self._node_uid) if gpus else []
        content = [_slice_content(body) for body in wanted]
        if content == self._published:
            return False
        existing = {s["metadata"]["name"]: s for s in self._api.list_slices(node.name)}
        generation = 1 + max((int(s["spec"]["pool"].get("generation", 0)) for s in existing.values()), default=0)
        for body in wanted:
            body["spec"]["pool"]["generation"] = generation  # the content is the same at any generation
            current = existing.pop(body["metadata"]["name"], None)
            if current is None:
                self._api.create_slice(body)
            else:
                self._api.replace_slice(body, current["metadata"]["resourceVersion"])
        for stale in existing:
            self._api.delete_slice(stale)
        self.api_problem = dropped_fields(wanted, self._api.list_slices(node.name)) if wanted else None
        if self.api_problem is not None:
            log.error("DRA: %s", self.api_problem)
        self._published = content
        log.info("DRA: published the ResourceSlices of node %s (pool generation %d, %d GPUs; front door %s: %s)",
                 node.name, generation, len(gpus), node.front_door.door, node.front_door.why)
        return True

    def _owner_uid(self, node: str) -> str:
        """The Node's UID, to own the slices; "" while the API server has no such Node (asked again next time)."""
        try:
            return self._api.node_uid(node)
        except NotFoundError as err:
            log.warning("DRA: the slices are published without their Node owner for now: %s", err)
            return ""

    def republish(self) -> None:
        """Write the slices again at the next publish, changed or not: the kubelet deletes a driver's slices when it
        restarts or loses the driver, and registers it again afterwards (this is called then)."""
        self._published = None

    def keep_published(self, stop: threading.Event, interval: float, before: Callable[[], None] = lambda: None) -> None:
        """Publish now and whenever the GPUs change (usable memory moves as MPS servers take their contexts) or the
        front door does; `before` runs ahead of each publishing (it reads the node's labels)."""
        while not stop.is_set():
            before()
            try:
                self.reconcile()
            except KubeError as err:
                log.warning("DRA: holding the prepared claims against the API server failed: %s", err)
            try:
                self.publish()
            except ConflictError:
                self._published = None  # someone else wrote one: read them again at once
                continue
            except KubeError as err:
                log.warning("DRA: publishing the ResourceSlices failed, retrying in %.0f s: %s", interval, err)
                self._published = None
            stop.wait(interval)


# ---- what the agent knows, as Prepare needs it ----

def slice_gpus(inventory: Inventory, usable_labels: dict[str, str]) -> dict[int, SliceGpu]:
    """Per GPU its usable memory: the agent's usable-memory label of its model (the smallest of that model's GPUs on
    the node, net of the driver's reserve and the MPS servers' contexts), else NVML's total."""
    gpus = {}
    for gpu in inventory.gpus:
        label = usable_labels.get(usable_label(gpu.name), "")
        usable = int(label) << 20 if label.isdigit() else gpu.memory_total_bytes
        gpus[gpu.index] = SliceGpu(gpu, usable)
    return gpus


@dataclass(frozen=True)
class NodeHolds:
    """What keeps a claim off the node's GPUs, beside its front door (DraNode's fields of the same names)."""

    unenforced: Mapping[str, str] = field(default_factory=dict)
    plugin_gpus: Mapping[str, str] = field(default_factory=dict)
    lost: Mapping[str, str] = field(default_factory=dict)
    cdi_problem: str | None = None
    mps_namespaces: bool = False


def dra_node(name: str, inventory: Inventory | None, usable_labels: dict[str, str], mps_root: str,
             mps_modes: Iterable[str], cdi_devices: frozenset[str], dev: Path = Path("/dev"), *,
             front_door: FrontDoorChoice = DRA_DOOR, placed: Iterable[RunningContainer] = (),
             holds: NodeHolds = NodeHolds()) -> DraNode | None:
    if inventory is None:
        return None
    annotated = {gpu_identity(entry, inventory.gpus): f"container {c.container} of pod {c.namespace}/{c.pod}"
                 for c in placed for entry in c.fraction.devices}
    return DraNode(name=name, gpus=slice_gpus(inventory, usable_labels), mps_root=mps_root,
                   mps_modes=frozenset(mps_modes), cdi_devices=cdi_devices,
                   host_devices=control_devices(f"/dev/{path.name}" for path in dev.glob("nvidia*")),
                   front_door=front_door, annotated=annotated, unenforced=holds.unenforced,
                   plugin_gpus=holds.plugin_gpus, lost=holds.lost, cdi_problem=holds.cdi_problem,
                   mps_namespaces=holds.mps_namespaces)


class FrontDoorWatch:
    """The node's front door (decide.front_door), read from its labels before each publishing of the slices: the
    label is the operator's, so a relabelled node changes door within one publishing interval."""

    def __init__(self, read_labels: Callable[[], dict[str, str]], default: FrontDoor) -> None:
        self._read = read_labels
        self._default = default
        self.choice = choose({}, True, default)

    def refresh(self) -> None:
        try:
            labels = self._read()
        except KubeError as err:
            log.warning("DRA: reading the node's labels failed, the front door stays %s: %s", self.choice.door, err)
            return
        choice = choose(labels, True, self._default)
        if choice != self.choice:
            log.info("DRA: the node's front door is %s (%s)", choice.door, choice.why)
            if choice.problem:
                log.warning("DRA: %s", choice.problem)
        self.choice = choice
