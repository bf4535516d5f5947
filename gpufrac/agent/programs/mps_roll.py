"""`gpufrac mps-roll`: move each node's MPS pod to the MPS DaemonSet's current template, one node at a time.

The MPS DaemonSet is OnDelete (a `helm upgrade` must not cut running MPS clients off their server) and `kubectl
drain` skips DaemonSet pods, so after an upgrade its pods stay on the old image until someone deletes them. Per node
whose MPS pod is not of the DaemonSet's current revision: cordon it (no new fractional pod lands there), wait for its
fractional pods to finish (`--wait`), or evict them (`--evict`), or only list them; delete the MPS pod; wait for
the DaemonSet's new pod there to be Ready; uncordon (unless it was cordoned before). A node whose fractional pods
are still there when the wait ends is left as it was, and named. `--dry-run` says what would be done.

The decisions (which nodes, which pods count as clients, what a node's outcome is) are pure functions; the
Kubernetes calls go through the small `RollApi`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

from gpufrac.core.jsonlog import add_log_arguments, setup_logging
from gpufrac.kube.errors import KubeError

log = logging.getLogger("gpufrac.agent.programs.mps_roll")

REVISION_LABEL = "controller-revision-hash"  # what the DaemonSet controller puts on each pod it makes
FINISHED_PHASES = ("Succeeded", "Failed")


class RollApi(Protocol):
    def read_daemonset(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def current_revision(self, namespace: str, daemonset: Mapping[str, Any]) -> str: ...

    def list_namespaced_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]: ...

    def list_pods(self, node: str) -> tuple[list[dict[str, Any]], str]: ...  # the node's fractional pods

    def list_nodes(self) -> list[dict[str, Any]]: ...

    def set_unschedulable(self, node: str, unschedulable: bool) -> None: ...

    def delete_pod(self, namespace: str, name: str) -> bool: ...

    def evict_pod(self, namespace: str, name: str) -> bool: ...


@dataclass(frozen=True)
class Options:
    namespace: str
    daemonset: str
    nodes: tuple[str, ...] = ()  # only these nodes (default: every node with an MPS pod)
    wait: float = 0.0  # how long a node's fractional pods get to finish
    evict: bool = False  # evict them instead of waiting for them to finish
    timeout: float = 300.0  # for the new MPS pod to be Ready
    dry_run: bool = False
    poll: float = 2.0


@dataclass(frozen=True)
class NodePlan:
    node: str
    pod: str  # the node's MPS pod now
    revision: str  # its revision
    current: bool  # already of the DaemonSet's current revision


@dataclass(frozen=True)
class NodeOutcome:
    node: str
    result: str  # current | rolled | blocked | timeout | planned
    old_pod: str = ""
    new_pod: str = ""
    clients: tuple[str, ...] = ()  # namespace/name of the fractional pods that were (or are still) there
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.result in ("current", "rolled", "planned")

    def line(self) -> str:
        clients = f"; fractional pods: {', '.join(self.clients)}" if self.clients else ""
        return {
            "current": f"node {self.node}: MPS pod {self.old_pod} is current",
            "planned": f"node {self.node}: would replace MPS pod {self.old_pod}{clients}",
            "rolled": f"node {self.node}: MPS pod {self.old_pod} replaced by {self.new_pod} in {self.seconds:.1f} s"
                      f"{clients}",
            "blocked": f"node {self.node}: MPS pod {self.old_pod} kept, fractional pods still running: "
                       f"{', '.join(self.clients)} (wait for them with --wait SECONDS, or --evict them)",
            "timeout": f"node {self.node}: MPS pod {self.old_pod} deleted, but no new one was Ready after "
                       f"{self.seconds:.0f} s; the node stays cordoned: look at the DaemonSet's pod there",
        }[self.result]


# ---- decisions (pure) ----


def selector(daemonset: Mapping[str, Any]) -> str:
    labels = ((daemonset.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def plan(revision: str, mps_pods: Iterable[Mapping[str, Any]], only: tuple[str, ...] = ()) -> list[NodePlan]:
    """One entry per node that has an MPS pod (not one being deleted), sorted by node; only the `only` nodes when
    given."""
    plans = {}
    for pod in mps_pods:
        metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        node = spec.get("nodeName") or ""
        if not node or metadata.get("deletionTimestamp") or (only and node not in only):
            continue
        pod_revision = (metadata.get("labels") or {}).get(REVISION_LABEL, "")
        plans[node] = NodePlan(node, str(metadata.get("name", "")), pod_revision, pod_revision == revision)
    return [plans[n] for n in sorted(plans)]


def active_clients(pods: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """The fractional pods that may hold an MPS connection: not finished (a terminating one still may)."""
    return tuple(sorted(
        f"{(p.get('metadata') or {}).get('namespace', '')}/{(p.get('metadata') or {}).get('name', '')}"
        for p in pods if (p.get("status") or {}).get("phase") not in FINISHED_PHASES))


def replacement(mps_pods: Iterable[Mapping[str, Any]], node: str, old_pod: str, revision: str) -> str | None:
    """The name of the DaemonSet's new pod on `node` once it is Ready, of the current revision; None before."""
    for pod in mps_pods:
        metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
        if ((pod.get("spec") or {}).get("nodeName") != node or metadata.get("name") == old_pod
                or metadata.get("deletionTimestamp")
                or (metadata.get("labels") or {}).get(REVISION_LABEL) != revision):
            continue
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
            return str(metadata["name"])
    return None


def cordoned(nodes: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    return frozenset(str((n.get("metadata") or {}).get("name", "")) for n in nodes
                     if (n.get("spec") or {}).get("unschedulable"))


# ---- doing it ----


@dataclass
class Roller:
    kube: RollApi
    options: Options
    revision: str
    selector: str
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def roll(self, step: NodePlan, was_cordoned: bool) -> NodeOutcome:
        if step.current:
            return NodeOutcome(step.node, "current", step.pod)
        clients = active_clients(self.kube.list_pods(step.node)[0])
        if self.options.dry_run:
            return NodeOutcome(step.node, "planned", step.pod, clients=clients)
        if not was_cordoned:
            self.kube.set_unschedulable(step.node, True)
            log.info("cordoned node %s", step.node, extra={"node": step.node})
        left = self._drain_clients(step.node, clients)
        if left:
            if not was_cordoned:
                self.kube.set_unschedulable(step.node, False)
            return NodeOutcome(step.node, "blocked", step.pod, clients=left)
        started = self.clock()
        self.kube.delete_pod(self.options.namespace, step.pod)
        log.info("deleted MPS pod %s on node %s", step.pod, step.node, extra={"node": step.node, "pod": step.pod})
        new_pod = self._wait_for_replacement(step)
        seconds = round(self.clock() - started, 1)
        if new_pod is None:
            return NodeOutcome(step.node, "timeout", step.pod, seconds=seconds)
        if not was_cordoned:
            self.kube.set_unschedulable(step.node, False)
            log.info("uncordoned node %s", step.node, extra={"node": step.node})
        return NodeOutcome(step.node, "rolled", step.pod, new_pod, clients, seconds)

    def _drain_clients(self, node: str, clients: tuple[str, ...]) -> tuple[str, ...]:
        """Evict (with --evict) and wait for the node's fractional pods; those still there at the end."""
        if not clients:
            return ()
        if not self.options.evict and self.options.wait <= 0:
            return clients
        deadline = self.clock() + (self.options.timeout if self.options.evict else self.options.wait)
        while True:
            if self.options.evict:
                for ref in clients:
                    namespace, name = ref.split("/", 1)
                    self.kube.evict_pod(namespace, name)  # refused for now (a PodDisruptionBudget): tried again
            if self.clock() >= deadline:
                return clients
            self.sleep(self.options.poll)
            clients = active_clients(self.kube.list_pods(node)[0])
            if not clients:
                return ()

    def _wait_for_replacement(self, step: NodePlan) -> str | None:
        deadline = self.clock() + self.options.timeout
        while True:
            pods = self.kube.list_namespaced_pods(self.options.namespace, self.selector)
            new_pod = replacement(pods, step.node, step.pod, self.revision)
            if new_pod is not None or self.clock() >= deadline:
                return new_pod
            self.sleep(self.options.poll)


def roll(kube: RollApi, options: Options, out: TextIO = sys.stdout, *, clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], None] = time.sleep) -> list[NodeOutcome]:
    """Every node, one after the other; a line per node on `out`. Raises KubeError; LookupError when the
    DaemonSet does not exist."""
    daemonset = kube.read_daemonset(options.namespace, options.daemonset)
    if daemonset is None:
        raise LookupError(f"no DaemonSet {options.namespace}/{options.daemonset}: give the MPS DaemonSet of the "
                          "release (<release>-mps) with --namespace and --daemonset")
    pods = kube.list_namespaced_pods(options.namespace, selector(daemonset))
    revision = kube.current_revision(options.namespace, daemonset) if pods else ""  # no pods: nothing to compare
    roller = Roller(kube, options, revision, selector(daemonset), clock, sleep)
    steps = plan(revision, pods, options.nodes)
    already = cordoned(kube.list_nodes())
    outcomes = []
    for step in steps:
        outcome = roller.roll(step, step.node in already)
        print(outcome.line(), file=out, flush=True)
        outcomes.append(outcome)
    missing = sorted(set(options.nodes) - {s.node for s in steps})
    for node in missing:
        print(f"node {node}: no MPS pod of {options.daemonset} there", file=out)
    return outcomes


# ---- the command ----


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", default="gpufrac-system", help="the release namespace")
    parser.add_argument("--daemonset", default="gpufrac-mps", metavar="NAME",
                        help="the MPS DaemonSet (<release>-mps)")
    parser.add_argument("--node", action="append", metavar="NAME",
                        help="roll only this node (repeatable; default: every node with an MPS pod)")
    parser.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                        help="how long a node's fractional pods (MPS clients) get to finish before the node is "
                             "left as it was (default 0: list them and go on to the next node)")
    parser.add_argument("--evict", action="store_true",
                        help="evict the node's fractional pods (PodDisruptionBudgets apply) instead of waiting")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                        help="how long the new MPS pod gets to be Ready (and evicted pods to go)")
    parser.add_argument("--dry-run", action="store_true", help="say what would be done; change nothing")
    parser.add_argument("--kubeconfig", default=None,
                        help="kubeconfig file (default: the in-cluster service account, then $KUBECONFIG)")
    add_log_arguments(parser, level="warning")


def options_from_args(args: argparse.Namespace) -> Options:
    return Options(args.namespace, args.daemonset, tuple(args.node or ()), args.wait, args.evict, args.timeout,
                   args.dry_run)


def run(args: argparse.Namespace) -> int:
    """Exit 0: every node's MPS pod is current (or would be made so); 1: a node was left behind or a call failed;
    2: bad flags."""
    setup_logging(args.log_level, fmt=args.log_format)
    if args.wait < 0 or args.timeout <= 0:
        print("gpufrac mps-roll: --wait must be 0 or more and --timeout positive", file=sys.stderr)
        return 2
    from gpufrac.agent.edges.kube import KubeClient  # the kubernetes client only where a real cluster is used

    try:
        kube = KubeClient.from_config(args.kubeconfig)
    except Exception as err:  # no kubeconfig, no in-cluster service account
        print(f"gpufrac mps-roll: cannot load the cluster's configuration: {err}", file=sys.stderr)
        return 1
    try:
        outcomes = roll(kube, options_from_args(args))
    except (KubeError, LookupError) as err:
        print(f"gpufrac mps-roll: {err}", file=sys.stderr)
        return 1
    return 0 if all(o.ok for o in outcomes) else 1
