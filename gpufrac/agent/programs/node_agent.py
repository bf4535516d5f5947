"""`gpufrac agent`: its flags, and the process around the Agent (signals, HTTP server). The one entry point is
`gpufrac agent` (gpufrac/cli.py)."""

from __future__ import annotations

import argparse
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from gpufrac.agent.decide.capabilities import KAI_CONDITION_TYPES, ready_condition_types
from gpufrac.agent.decide.errors import AgentError, ConfigError
from gpufrac.agent.decide.events import EventSink
from gpufrac.agent.decide.hard_limits import WithoutHardLimit
from gpufrac.agent.decide.overlimit import OverLimitAction
from gpufrac.agent.decide.reclaim import ReclaimPolicy, ReclaimSettings
from gpufrac.agent.dra.service import add_dra_arguments
from gpufrac.agent.edges.cdi_specs import DEFAULT_CDI_DIRS, CdiSpecs
from gpufrac.agent.edges.metrics import AgentMetrics
from gpufrac.agent.edges.node_facts import Where, log_node_check
from gpufrac.agent.node.agent_config import AgentConfig, DaemonOwner
from gpufrac.agent.node.doors import DoorFactory, FrontDoor, NodeChecks, NodeView
from gpufrac.agent.node.guarantee import GuaranteeConfig
from gpufrac.agent.node.kai_fractioning import KaiFractioningWatch
from gpufrac.agent.node.node_loop import Agent
from gpufrac.agent.node.unplaceable_fractions import UnplaceableFractionsWatch
from gpufrac.agent.node.webhook_skew import WebhookSkewWatch
from gpufrac.agent.nri.config import NriConfig
from gpufrac.agent.programs.daemon_options import add_daemon_arguments, restart_policy
from gpufrac.agent.programs.host_withdraw import DaemonSetApi, host_root, withdraw_from_host
from gpufrac.agent.programs.stop_signal import stop_on_signals
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.buildinfo import version
from gpufrac.core.contract import MIB
from gpufrac.core.jsonlog import add_log_arguments, setup_logging
from gpufrac.probes.server import BindError, ProbeServer, registry_text

if TYPE_CHECKING:
    from gpufrac.agent.edges.kube import KubeClient
    from gpufrac.agent.nri.service import NriService

DEFAULT_METRICS_BIND = ":9475"  # not 9400: DCGM exporter's port

log = logging.getLogger("gpufrac.agent")


def _modes(text: str) -> tuple[ComputeMode, ...]:
    try:
        return tuple(ComputeMode(m.strip()) for m in text.split(",") if m.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"{text}: expected a comma list of {', '.join(ComputeMode)}"
        ) from err


_DEFAULTS = AgentConfig(node="")  # every default is written once: in AgentConfig, DaemonSettings, RestartPolicy
_RECLAIM = _DEFAULTS.guarantee.reclaim
_NRI = NriConfig()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", default=os.environ.get("NODE_NAME"),
                        help="this node's name (default: $NODE_NAME, from the downward API)")
    parser.add_argument("--kubeconfig", default=None,
                        help="kubeconfig file (default: the in-cluster service account, then $KUBECONFIG)")
    parser.add_argument("--modes", type=_modes, default=",".join(_DEFAULTS.modes), metavar="MODE,…",
                        help=f"compute modes to serve, a comma list of {', '.join(ComputeMode)}")
    add_daemon_arguments(parser)
    parser.add_argument("--cgroup-controllers-file", type=Path, default=_DEFAULTS.cgroup_controllers_file,
                        metavar="PATH", help="the agent's cgroup v2 controllers: with dmem there (and r615+), the "
                                             "driver takes back memory above a request and the agent evicts nothing "
                                             "for it")
    parser.add_argument("--memory-limit-file", type=Path, default=_DEFAULTS.memory_limit_file, metavar="PATH",
                        help="the agent container's cgroup memory limit, checked against the MPS budget")
    parser.add_argument("--metrics-bind", default=DEFAULT_METRICS_BIND, metavar="HOST:PORT",
                        help="serves /metrics, /healthz and /readyz; no host: every address of the pod's IP family")
    parser.add_argument("--interval", type=float, default=_DEFAULTS.interval, metavar="SECONDS",
                        help="time between audits")
    parser.add_argument("--evict-on-violation", action=argparse.BooleanOptionalAction,
                        default=_DEFAULTS.evict_on_violation,
                        help="evict a pod whose GPU processes break its limits (once per pod)")
    parser.add_argument("--over-limit-action", type=OverLimitAction, choices=list(OverLimitAction),
                        default=_DEFAULTS.guarantee.over_limit_action,
                        help="besides a Warning Event and the metric, what happens to a container whose GPU processes "
                             "together use more than its limit: event (nothing), evict (its pod), kill-newest (its "
                             "newest GPU process; the others keep running)")
    parser.add_argument("--without-hard-limit", type=WithoutHardLimit, choices=list(WithoutHardLimit),
                        default=_DEFAULTS.without_hard_limit,
                        help="where the driver cannot hold a fraction's memory limit on its cgroup (cgroup v1, a "
                             "driver before r615, NVML refuses): report (labels and condition say so) or refuse "
                             "the creation of fractions on the node")
    parser.add_argument("--reclaim-policy", type=ReclaimPolicy, choices=list(ReclaimPolicy), default=_RECLAIM.policy,
                        help="when the memory owed to containers below their requests does not fit in a GPU's free "
                             "memory: evict pods above their requests (lowest priority, then youngest) through the "
                             "Eviction API, or off (an Event and a metric say what would have been evicted)")
    parser.add_argument("--reclaim-grace-period", type=float, default=_RECLAIM.grace_seconds, metavar="SECONDS",
                        help="how long a GPU's shortfall must last before reclaim acts, and the wait between actions")
    parser.add_argument("--reclaim-hysteresis-mib", type=int, default=_RECLAIM.hysteresis_bytes // MIB,
                        metavar="MIB", help="free memory beyond what is owed that ends a GPU's contention (no flapping "
                                            "at the threshold)")
    parser.add_argument("--reclaim-protected-priority", type=int, default=_RECLAIM.protected_priority,
                        metavar="PRIORITY", help="pods whose spec.priority is at least this are never evicted by "
                                                 "reclaim (default: none protected)")
    parser.add_argument("--reclaim-backoff", type=float, default=_RECLAIM.backoff_seconds, metavar="SECONDS",
                        help="after reclaim evicts a pod with a controller, keep that controller's fractional pods off "
                             "this node this long (a node label their node affinity fails on; 0: not at all)")
    parser.add_argument("--reclaim-victim-grace-period", type=int, default=_RECLAIM.victim_grace_seconds,
                        metavar="SECONDS", help="the grace period an evicted pod gets (the eviction's "
                                                "gracePeriodSeconds; -1: the pod's own terminationGracePeriodSeconds)")
    parser.add_argument("--reclaim-evict-gang-members", action=argparse.BooleanOptionalAction,
                        default=_RECLAIM.evict_gang_members,
                        help="evict members of a KAI gang (PodGroup) like any pod, even below its minMember (default: "
                             "no more of a gang's members than it can lose)")
    parser.add_argument("--ready-condition-type", action="append", metavar="TYPE",
                        help="node condition published with gpufrac.io/Ready's status, besides it (repeatable; "
                             f"default {' and '.join(KAI_CONDITION_TYPES)}, the names KAI's NvFractions mode gates "
                             "fractional placement on; '' for none)")
    parser.add_argument("--mps-daemons", type=DaemonOwner, choices=list(DaemonOwner), default=_DEFAULTS.mps_daemons,
                        help="agent: run the MPS daemons as the agent's children (they stop with it); external: "
                             "`gpufrac mps` runs them in their own containers (the chart's <release>-mps DaemonSet) "
                             "and the agent finds and watches them, so its restarts and upgrades leave them running")
    parser.add_argument("--csi", action=argparse.BooleanOptionalAction, default=False,
                        help="serve the CSI node plugin that mounts each mode's MPS directories into fractional pods")
    parser.add_argument("--csi-driver", default=_DEFAULTS.csi_driver, help="the CSI driver's name (CSIDriver object)")
    parser.add_argument("--kubelet-dir", type=Path, default=Path("/var/lib/kubelet"), metavar="PATH",
                        help="the kubelet's root directory, mounted at the same path: plugins/<driver>/csi.sock is "
                             "served there and plugins_registry/<driver>-reg.sock announces it")
    parser.add_argument("--nri", action=argparse.BooleanOptionalAction, default=False,
                        help="run the NRI plugin: at each container creation the runtime (containerd 2.x, CRI-O) "
                             "asks it, and it hands fractional containers their GPU devices (CDI or device nodes) "
                             "and gives every other container none")
    parser.add_argument("--nri-socket", type=Path, default=_NRI.socket_path, metavar="PATH",
                        help="the runtime's NRI socket (containerd: [plugins.'io.containerd.nri.v1.nri'] "
                             "socket_path)")
    parser.add_argument("--nri-lock-file", type=Path, default=_NRI.lock_file, metavar="PATH",
                        help="a host file the plugin locks, so two agents on one node never register at once")
    parser.add_argument("--nri-index", default=_NRI.index, metavar="NN",
                        help="the plugin's two-digit index: plugins are called in index order")
    parser.add_argument("--nri-void-env-grants", action=argparse.BooleanOptionalAction, default=_NRI.void_env_grants,
                        help="give containers that are no GPU fraction NVIDIA_VISIBLE_DEVICES=void (and no MIG or "
                             "IMEX grant), so their env cannot take a GPU; --no-nri-void-env-grants leaves it alone")
    parser.add_argument("--nri-trusted-namespace", action="append", metavar="NAMESPACE",
                        help="a namespace whose pods keep their NVIDIA_VISIBLE_DEVICES (the GPU stack's own: device "
                             "plugin, DCGM exporter); repeatable; default kube-system, nvidia-device-plugin, "
                             "gpu-operator, nvidia-gpu-operator; the agent's own namespace ($POD_NAMESPACE) always, "
                             "and any container binding the kubelet's device-plugins directory")
    parser.add_argument("--nri-env-fallback", action="store_true",
                        help="without an NRI socket, keep the node Ready for fractions, whose GPUs then come from "
                             "NVIDIA_VISIBLE_DEVICES alone (which any pod may set); default: not Ready "
                             "(NriUnavailable)")
    parser.add_argument("--nri-device-checkpoint", type=Path, default=_NRI.device_checkpoint, metavar="PATH",
                        help="the kubelet's device manager checkpoint (the kubelet's path is fixed, whatever its "
                             "--root-dir): GPUs it allocated to a container (NVIDIA's device plugin) are left to it; "
                             "mount its directory read-only")
    add_dra_arguments(parser)
    parser.add_argument("--cdi-spec-dir", type=Path, action="append", metavar="PATH",
                        help="a directory of CDI specs, as the runtime's cdi_spec_dirs (repeatable; default "
                             f"{', '.join(map(str, DEFAULT_CDI_DIRS))})")
    parser.add_argument("--image", default="", metavar="REF",
                        help="the image the agent runs in (the chart sets it): with the version, the build it "
                             "compares with the MPS pods' (gpufrac_mps_version_skew)")
    parser.add_argument("--webhook-deployment", default="", metavar="NAME",
                        help="the release's webhook Deployment (in $POD_NAMESPACE): its version is checked against "
                             "the agent's once a minute (the skew rule: the same major.minor)")
    parser.add_argument("--withdraw-daemonset", default="", metavar="NAME",
                        help="the agents' DaemonSet (in $POD_NAMESPACE): when it is gone as the agent stops (the "
                             "uninstall), the --withdraw-host-path paths are removed from the host")
    parser.add_argument("--withdraw-host-path", action="append", default=[], metavar="PATH",
                        help="a host path (file, directory or glob) the release leaves, removed at the uninstall "
                             "through the host's root under --proc-root (repeatable)")
    add_log_arguments(parser)


def node_checks(args: argparse.Namespace, kube: KubeClient, metrics: AgentMetrics, node: str) -> NodeChecks:
    """KAI's gpu-fractioning operator on the node: the agent stands down (decide.kai_fractioning); a webhook of
    another minor version: a remark on the node's condition; fractions no node can place (a driver before r615 on
    every node, and no mode named): an Event on each (decide.unplaceable_fractions)."""
    kai = KaiFractioningWatch(kube, kube, node)
    namespace = os.environ.get("POD_NAMESPACE", "")
    skew = (WebhookSkewWatch(kube, namespace, args.webhook_deployment, version(), metrics),) \
        if args.webhook_deployment and namespace else ()
    return NodeChecks(blockers=(kai,), remarks=skew, standing_down=kai.standing_down,
                      watches=(UnplaceableFractionsWatch(kube, node, metrics),))


def withdraw_host(args: argparse.Namespace, kube: DaemonSetApi) -> None:
    namespace = os.environ.get("POD_NAMESPACE", "")
    if args.withdraw_daemonset and namespace:
        withdraw_from_host(kube, namespace, args.withdraw_daemonset, args.withdraw_host_path,
                           host_root(Path(args.proc_root)))


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    if not args.node:
        raise ConfigError("--node is required (or set NODE_NAME)")
    if args.interval <= 0:
        raise ConfigError(f"--interval {args.interval}: must be positive")
    if args.reclaim_grace_period < 0 or args.reclaim_hysteresis_mib < 0:
        raise ConfigError("--reclaim-grace-period and --reclaim-hysteresis-mib must be at least 0")
    return AgentConfig(
        node=args.node,
        modes=args.modes,
        mps_binary=args.mps_binary,
        mps_root=args.mps_root,
        mps_log_root=args.mps_log_root,
        mps_config_dir=args.mps_config_dir,
        proc_root=args.proc_root,
        memory_limit_file=args.memory_limit_file,
        cgroup_controllers_file=args.cgroup_controllers_file,
        interval=args.interval,
        evict_on_violation=args.evict_on_violation,
        restart_policy=restart_policy(args),
        quit_timeout=args.quit_timeout,
        extra_condition_types=ready_condition_types(args.ready_condition_type),
        csi_driver=args.csi_driver,
        mps_daemons=args.mps_daemons,
        guarantee=GuaranteeConfig(
            args.over_limit_action,
            ReclaimSettings(args.reclaim_policy, args.reclaim_grace_period, args.reclaim_hysteresis_mib * MIB,
                            args.reclaim_protected_priority, args.reclaim_evict_gang_members,
                            args.reclaim_backoff,
                            None if args.reclaim_victim_grace_period < 0 else args.reclaim_victim_grace_period),
        ),
        image=args.image,
        without_hard_limit=args.without_hard_limit,
    )


def nri_service(args: argparse.Namespace, node: NodeView, kube: EventSink, metrics: AgentMetrics) -> NriService | None:
    if not args.nri:
        return None
    if not re.fullmatch(r"[0-9]{2}", args.nri_index):
        raise ConfigError(f"--nri-index {args.nri_index}: expected two digits, such as 10")
    from gpufrac.agent.nri.service import NriService

    trusted = set(_NRI.trusted_namespaces if args.nri_trusted_namespace is None else args.nri_trusted_namespace)
    if os.environ.get("POD_NAMESPACE"):  # the agent's and the MPS daemons' pods hold every GPU through their env
        trusted.add(os.environ["POD_NAMESPACE"])
    config = NriConfig(args.nri_socket, index=args.nri_index, lock_file=args.nri_lock_file,
                       void_env_grants=args.nri_void_env_grants, trusted_namespaces=frozenset(trusted),
                       device_checkpoint=args.nri_device_checkpoint, proc_root=args.proc_root,
                       env_fallback=args.nri_env_fallback)
    return NriService(config, node, kube, metrics, cdi=CdiSpecs(args.cdi_spec_dir or DEFAULT_CDI_DIRS),
                      watch_runtime=True)


def front_doors(args: argparse.Namespace, kube: KubeClient, metrics: AgentMetrics) -> list[DoorFactory]:
    """The doors the agent is built with, in the order they start: CSI, NRI, DRA."""
    from gpufrac.agent.csi.service import csi_door
    from gpufrac.agent.dra.service import dra_door

    nri = nri_door(args, kube, metrics)
    dra = dra_door(args, kube.api_client)
    return [door for door in (csi_door(args.kubelet_dir) if args.csi else None, nri, dra) if door is not None]


def nri_door(args: argparse.Namespace, kube: EventSink, metrics: AgentMetrics) -> DoorFactory | None:
    if not args.nri:
        return None
    if not re.fullmatch(r"[0-9]{2}", args.nri_index):  # before the agent is built
        raise ConfigError(f"--nri-index {args.nri_index}: expected two digits, such as 10")

    def build(node: NodeView) -> FrontDoor:
        service = nri_service(args, node, kube, metrics)
        assert service is not None
        return service

    return build


def node_check_where(args: argparse.Namespace) -> Where:
    """What `gpufrac node-check` looks at, from the agent's own settings (no runtime binary in its container)."""
    return Where(modes=args.modes, nri_enabled=args.nri, nri_socket=args.nri_socket,
                 cdi_dirs=tuple(args.cdi_spec_dir or DEFAULT_CDI_DIRS), containerd="", mps_binary=args.mps_binary,
                 mps_root=args.mps_root)


def probe_server(bind: str, metrics: AgentMetrics, agent: Agent) -> ProbeServer:
    try:
        return ProbeServer(bind, registry_text(metrics.registry), {"/healthz": agent.healthz, "/readyz": agent.readyz})
    except BindError as err:
        raise ConfigError(f"--metrics-bind {err}") from err


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level, fmt=args.log_format)
    from gpufrac.agent.edges.kube import KubeClient
    from gpufrac.agent.edges.nvml import NvmlSource

    try:
        config = config_from_args(args)
        metrics = AgentMetrics(node=config.node)
        kube = KubeClient.from_config(args.kubeconfig)
        agent = Agent(config, kube, NvmlSource(), metrics, doors=front_doors(args, kube, metrics),
                      checks=node_checks(args, kube, metrics, config.node))
        server = probe_server(args.metrics_bind, metrics, agent)
        log_node_check(node_check_where(args), log)
        agent.doors.start()
    except AgentError as err:
        log.error("%s", err)
        return 2
    except Exception as err:  # a kubeconfig that cannot be loaded, for instance
        log.error("cannot start the agent: %s", err)
        return 2
    stop = stop_on_signals(log, "MPS daemons get `quit`")
    server.start()
    log.info("gpufrac agent on node %s; metrics on %s", config.node, args.metrics_bind)
    try:
        return agent.run(stop)
    finally:
        agent.doors.stop()
        server.stop()
        withdraw_host(args, kube)
