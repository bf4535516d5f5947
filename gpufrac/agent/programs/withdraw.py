"""`gpufrac agent-withdraw`, the chart's pre-delete hook: before `helm uninstall` deletes the release, stop the MPS
daemons' DaemonSet and the node agents (which remove the release's host paths as they stop, host_withdraw), then
take what gpufrac wrote off the nodes (every gpufrac.io/ label and annotation, gpufrac.io/Ready and the readiness
types published beside it, such as KAI's gpu-sharing.nvidia.com/Ready and gpu-fractioning.nvidia.com/Ready).

Why a hook and not the agent itself: the uninstall deletes the agents' RBAC together with their DaemonSet, so a
stopping agent could not patch its node reliably; and a stopping agent must not withdraw anything, since during a
rolling update its successor starts a moment later and the node's labels and readiness must not flap. Only the
hook knows that the release is going away.

The MPS daemons go first: their containers `quit` them on SIGTERM, and their pipe directories are free to go once
they have. The agents go next and are waited for (a terminating agent still publishes its "stopped" condition, and
removes the host paths), so nothing re-adds what was removed. Once this returns no daemon of the release is left
running. `withdraw()` depends only on the small `WithdrawApi`.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpufrac.agent.decide.capabilities import (
    CONDITION_TYPE,
    DRIVER_MAJOR_LABEL,
    GPU_COUNT_LABEL,
    KAI_CONDITION_TYPES,
    ready_condition_types,
)
from gpufrac.agent.decide.hard_limits import BOUNDARY_LABEL_PREFIX
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import enforcement_label
from gpufrac.core.jsonlog import add_log_arguments, setup_logging
from gpufrac.kube.errors import KubeError

log = logging.getLogger("gpufrac.agent.programs.withdraw")

# Every label `capabilities.node_labels` can publish, the boundary per mode (`hard_limits`); and the usable-memory
# labels, one per GPU model (`capacity`).
AGENT_LABELS = (*(enforcement_label(mode) for mode in ComputeMode), DRIVER_MAJOR_LABEL, GPU_COUNT_LABEL,
                *(f"{BOUNDARY_LABEL_PREFIX}{mode}" for mode in ComputeMode))
GPUFRAC_PREFIX = "gpufrac.io/"
DEFAULT_TIMEOUT = 90.0  # the chart's agent terminationGracePeriodSeconds (75) and some


class WithdrawApi(Protocol):
    def delete_daemonset(self, namespace: str, name: str) -> bool: ...

    def count_pods(self, namespace: str, label_selector: str) -> int: ...

    def list_nodes(self) -> list[dict[str, Any]]: ...

    def remove_node_labels(self, node: str, keys: tuple[str, ...]) -> None: ...

    def remove_node_conditions(self, node: str, condition_types: tuple[str, ...]) -> None: ...

    def remove_node_annotations(self, node: str, keys: tuple[str, ...]) -> None: ...

    def delete_secret(self, namespace: str, name: str) -> bool: ...


@dataclass(frozen=True)
class ReleaseDaemonSet:
    """A DaemonSet of the release and the selector of its pods."""

    name: str
    selector: str


@dataclass(frozen=True)
class WithdrawalPlan:
    namespace: str
    agents: ReleaseDaemonSet
    mps: ReleaseDaemonSet | None = None  # the <release>-mps DaemonSet, when the chart runs one
    condition_types: tuple[str, ...] = (CONDITION_TYPE,)
    timeout: float = DEFAULT_TIMEOUT  # for each DaemonSet's pods to go
    poll: float = 1.0
    secret: str = ""  # the self-managed CA's Secret (its private key), deleted last; "": kept


@dataclass
class WithdrawalOutcome:
    nodes: list[str] = field(default_factory=list)  # the nodes something was removed from
    agents_stopped_s: float | None = None  # None: still running at the timeout
    mps_stopped_s: float | None = None
    total_s: float = 0.0


@dataclass(frozen=True)
class Leftover:
    node: str
    labels: tuple[str, ...]
    condition_types: tuple[str, ...]
    annotations: tuple[str, ...] = ()


def leftover(node: Mapping[str, Any], condition_types: tuple[str, ...]) -> Leftover | None:
    """Which of gpufrac's labels, annotations and conditions this node (a Node as JSON) carries; None: none.

    Every key under gpufrac.io/ goes: the agent's own (AGENT_LABELS, the usable memory per GPU model), reclaim's
    back-offs (gpufrac.io/reclaimed.*) and the operator's gpufrac.io/front-door, which means nothing without the
    release."""
    metadata = node.get("metadata") or {}
    present = metadata.get("labels") or {}
    labels = tuple(key for key in AGENT_LABELS if key in present) + tuple(
        sorted(key for key in present if key.startswith(GPUFRAC_PREFIX) and key not in AGENT_LABELS))
    annotations = tuple(sorted(key for key in metadata.get("annotations") or {} if key.startswith(GPUFRAC_PREFIX)))
    found = {c.get("type") for c in (node.get("status") or {}).get("conditions") or []}
    conditions = tuple(t for t in condition_types if t in found) + tuple(
        sorted(t for t in found if isinstance(t, str) and t.startswith(GPUFRAC_PREFIX) and t not in condition_types))
    if not labels and not conditions and not annotations:
        return None
    return Leftover(str(metadata.get("name", "")), labels, conditions, annotations)


def condition_types(extra: tuple[str, ...]) -> tuple[str, ...]:
    """gpufrac.io/Ready and the types published beside it (the agent's --ready-condition-type), once each."""
    return tuple(dict.fromkeys((CONDITION_TYPE, *extra)))


def withdraw(kube: WithdrawApi, plan: WithdrawalPlan, *, clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep) -> WithdrawalOutcome:
    """Stop the MPS daemons, then the agents (each removes the release's host paths as it stops:
    host_withdraw), then remove gpufrac's labels, annotations and conditions from every node. Raises KubeError.

    A DaemonSet whose pods outlive the timeout (a node that is down keeps its pods Terminating) is logged and the
    rest is done anyway: an agent that cannot reach the API server cannot publish again either.
    """
    started = clock()
    outcome = WithdrawalOutcome()
    if plan.mps is not None:  # first: the agents, stopping, then remove the MPS directories from their hosts
        outcome.mps_stopped_s = _stop(kube, plan, plan.mps, clock, sleep)
    outcome.agents_stopped_s = _stop(kube, plan, plan.agents, clock, sleep)
    for item in filter(None, (leftover(n, plan.condition_types) for n in kube.list_nodes())):
        if item.labels:
            kube.remove_node_labels(item.node, item.labels)
        if item.condition_types:
            kube.remove_node_conditions(item.node, item.condition_types)
        if item.annotations:
            kube.remove_node_annotations(item.node, item.annotations)
        log.info("removed the agent's labels and conditions from node %s", item.node,
                 extra={"node": item.node, "labels": list(item.labels), "conditions": list(item.condition_types)})
        outcome.nodes.append(item.node)
    if plan.secret:
        deleted = kube.delete_secret(plan.namespace, plan.secret)
        log.info("%s Secret %s/%s (the CA's private key)", "deleted the" if deleted else "no", plan.namespace,
                 plan.secret, extra={"secret": plan.secret, "deleted": deleted})
    outcome.total_s = round(clock() - started, 3)
    return outcome


def _stop(kube: WithdrawApi, plan: WithdrawalPlan, workload: ReleaseDaemonSet, clock: Callable[[], float],
          sleep: Callable[[float], None]) -> float | None:
    """Delete the DaemonSet and wait until its pods are gone: the seconds that took, or None at the timeout."""
    started = clock()
    deleted = kube.delete_daemonset(plan.namespace, workload.name)
    log.info("%s DaemonSet %s/%s", "deleted the" if deleted else "no", plan.namespace, workload.name,
             extra={"daemonset": workload.name, "deleted": deleted})
    while (left := kube.count_pods(plan.namespace, workload.selector)) and clock() - started < plan.timeout:
        sleep(plan.poll)
    if left:
        log.warning("%d pod(s) of %s still there after %.0f s; going on without them", left, workload.name,
                    plan.timeout, extra={"daemonset": workload.name, "pods": left, "timeout_s": plan.timeout})
        return None
    seconds = round(clock() - started, 3)
    log.info("the pods of %s are gone", workload.name, extra={"daemonset": workload.name, "seconds": seconds})
    return seconds


# ---- the command ----


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", required=True, help="the release namespace, where both DaemonSets are")
    parser.add_argument("--agent-daemonset", required=True, metavar="NAME", help="the agents' DaemonSet")
    parser.add_argument("--agent-selector", required=True, metavar="SELECTOR",
                        help="label selector of the agents' pods (their DaemonSet's matchLabels)")
    parser.add_argument("--mps-daemonset", default="", metavar="NAME",
                        help="the MPS daemons' DaemonSet, stopped after the agents (default: none)")
    parser.add_argument("--mps-selector", default="", metavar="SELECTOR",
                        help="label selector of its pods (needed with --mps-daemonset)")
    parser.add_argument("--ready-condition-type", action="append", metavar="TYPE",
                        help="a node condition the agents publish beside gpufrac.io/Ready, removed with it (the "
                             "agent's flag of the same name: repeatable; default "
                             f"{' and '.join(KAI_CONDITION_TYPES)}; '' for none)")
    parser.add_argument("--delete-secret", default="", metavar="NAME",
                        help="a Secret of the namespace deleted at the end: the self-managed CA's, whose private key "
                             "must not outlive the release (default: none)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help="how long each DaemonSet's pods get to go (their terminationGracePeriodSeconds and "
                             "some) before the rest is done without them")
    parser.add_argument("--kubeconfig", default=None,
                        help="kubeconfig file (default: the in-cluster service account, then $KUBECONFIG)")
    add_log_arguments(parser)


def plan_from_args(args: argparse.Namespace) -> WithdrawalPlan:
    mps = ReleaseDaemonSet(args.mps_daemonset, args.mps_selector) if args.mps_daemonset else None
    return WithdrawalPlan(args.namespace, ReleaseDaemonSet(args.agent_daemonset, args.agent_selector), mps,
                condition_types(ready_condition_types(args.ready_condition_type)), args.timeout,
                secret=args.delete_secret)


def run(args: argparse.Namespace) -> int:
    """Exit 0: done (also when nothing was left); 1: an API call failed (the Job retries); 2: bad flags."""
    setup_logging(args.log_level, fmt=args.log_format)
    if args.mps_daemonset and not args.mps_selector:
        log.error("--mps-daemonset needs --mps-selector (the selector of its pods)")
        return 2
    if args.timeout <= 0:
        log.error("--timeout must be positive")
        return 2
    from gpufrac.agent.edges.kube import KubeClient  # the kubernetes client only where a real cluster is used

    try:
        kube = KubeClient.from_config(args.kubeconfig)
    except Exception as err:  # no kubeconfig, no in-cluster service account
        log.error("cannot load the cluster's configuration: %s", err)
        return 1
    try:
        outcome = withdraw(kube, plan_from_args(args))
    except KubeError as err:
        log.error("withdrawing the agents failed: %s", err)
        return 1
    log.info("the agents are withdrawn from %d node(s) in %.1f s", len(outcome.nodes), outcome.total_s,
             extra={"nodes": outcome.nodes, "agents_stopped_s": outcome.agents_stopped_s,
                    "mps_stopped_s": outcome.mps_stopped_s, "total_s": outcome.total_s})
    return 0
