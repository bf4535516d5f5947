"""`gpufrac agent`: its flags, and the process around the Agent (signals, HTTP server). The one entry point is
`gpufrac agent` (gpufrac/cli.py)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from gpufrac.agent.agent import Agent, AgentConfig, DaemonOwner
from gpufrac.agent.capabilities import KAI_CONDITION_TYPE, ready_condition_types
from gpufrac.agent.errors import AgentError, ConfigError
from gpufrac.agent.metrics import AgentMetrics
from gpufrac.agent.serve import AgentHttpServer
from gpufrac.agent.supervisor import RestartPolicy
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.jsonlog import LEVELS, setup_logging

if TYPE_CHECKING:
    from gpufrac.agent.csi.server import CsiPlugin

DEFAULT_METRICS_BIND = ":9475"  # not 9400: DCGM exporter's port

log = logging.getLogger("gpufrac.agent")


def _modes(text: str) -> tuple[ComputeMode, ...]:
    try:
        return tuple(ComputeMode(m.strip()) for m in text.split(",") if m.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"{text}: expected a comma list of {', '.join(ComputeMode)}"
        ) from err


_DEFAULTS = AgentConfig(node="")  # every default is written once, in AgentConfig and RestartPolicy
_RESTART = _DEFAULTS.restart_policy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", default=os.environ.get("NODE_NAME"),
                        help="this node's name (default: $NODE_NAME, from the downward API)")
    parser.add_argument("--kubeconfig", default=None,
                        help="kubeconfig file (default: the in-cluster service account, then $KUBECONFIG)")
    parser.add_argument("--modes", type=_modes, default=",".join(_DEFAULTS.modes), metavar="MODE,…",
                        help=f"compute modes to serve, a comma list of {', '.join(ComputeMode)}")
    parser.add_argument("--mps-binary", default=_DEFAULTS.mps_binary, help="the MPS control daemon executable")
    parser.add_argument("--mps-root", type=Path, default=_DEFAULTS.mps_root, metavar="PATH",
                        help="host directory holding one pipe directory per mode, <PATH>/<mode> (the webhook's "
                             "--mps-root)")
    parser.add_argument("--mps-log-root", type=Path, default=_DEFAULTS.mps_log_root, metavar="PATH",
                        help="directory holding one MPS log directory per mode")
    parser.add_argument("--mps-config-dir", type=Path, default=_DEFAULTS.mps_config_dir, metavar="PATH",
                        help="where the MPS v3 TOML config of each daemon is written")
    parser.add_argument("--proc-root", type=Path, default=_DEFAULTS.proc_root, metavar="PATH",
                        help="the host's /proc (the agent needs hostPID)")
    parser.add_argument("--memory-limit-file", type=Path, default=_DEFAULTS.memory_limit_file, metavar="PATH",
                        help="the agent container's cgroup memory limit, checked against the MPS budget")
    parser.add_argument("--metrics-bind", default=DEFAULT_METRICS_BIND, metavar="HOST:PORT",
                        help="serves /metrics, /healthz and /readyz; no host: every address of the pod's IP family")
    parser.add_argument("--interval", type=float, default=_DEFAULTS.interval, metavar="SECONDS",
                        help="time between audits")
    parser.add_argument("--evict-on-violation", action=argparse.BooleanOptionalAction,
                        default=_DEFAULTS.evict_on_violation,
                        help="evict a pod whose GPU processes break its limits (once per pod)")
    parser.add_argument("--restart-backoff", type=float, default=_RESTART.initial_backoff, metavar="SECONDS",
                        help="first delay before restarting a crashed MPS daemon; doubles per crash")
    parser.add_argument("--restart-backoff-max", type=float, default=_RESTART.max_backoff, metavar="SECONDS",
                        help="cap of that delay")
    parser.add_argument("--max-restarts", type=int, default=_RESTART.max_restarts, metavar="N",
                        help="crashes in a row before giving up on a daemon (0: never give up)")
    parser.add_argument("--stable-after", type=float, default=_RESTART.stable_after, metavar="SECONDS",
                        help="uptime after which a daemon's restart budget starts over")
    parser.add_argument("--quit-timeout", type=float, default=_DEFAULTS.quit_timeout, metavar="SECONDS",
                        help="time a daemon gets to exit after `quit` before it is killed")
    parser.add_argument("--ready-condition-type", action="append", metavar="TYPE",
                        help="node condition published with gpufrac.io/Ready's status, besides it (repeatable; "
                             f"default {KAI_CONDITION_TYPE}, which KAI's NvFractions mode gates fractional placement "
                             "on; '' for none)")
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
    parser.add_argument("--log-level", default="info", choices=LEVELS, type=str.lower,
                        help="the least severe log lines written (JSON, on stderr)")


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    if not args.node:
        raise ConfigError("--node is required (or set NODE_NAME)")
    if args.interval <= 0 or args.restart_backoff <= 0 or args.max_restarts < 0:
        raise ConfigError("--interval and --restart-backoff must be positive, --max-restarts at least 0")
    return AgentConfig(
        node=args.node,
        modes=args.modes,
        mps_binary=args.mps_binary,
        mps_root=args.mps_root,
        mps_log_root=args.mps_log_root,
        mps_config_dir=args.mps_config_dir,
        proc_root=args.proc_root,
        memory_limit_file=args.memory_limit_file,
        interval=args.interval,
        evict_on_violation=args.evict_on_violation,
        restart_policy=RestartPolicy(
            args.restart_backoff,
            max(args.restart_backoff_max, args.restart_backoff),
            args.max_restarts,
            args.stable_after,
        ),
        quit_timeout=args.quit_timeout,
        extra_condition_types=ready_condition_types(args.ready_condition_type),
        csi_driver=args.csi_driver,
        mps_daemons=args.mps_daemons,
    )


def csi_plugin(args: argparse.Namespace, agent: Agent) -> CsiPlugin | None:
    if not args.csi:
        return None
    from gpufrac.agent.csi.server import CsiConfig, CsiPlugin, plugin_paths

    endpoint, registration = plugin_paths(args.kubelet_dir, args.csi_driver)
    return CsiPlugin(CsiConfig(args.csi_driver, endpoint, registration), agent.node_dirs, agent.find_pod,
                     agent.pods.synced.is_set)


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    from gpufrac.agent.kube import KubeClient
    from gpufrac.agent.nvml import NvmlSource

    try:
        config = config_from_args(args)
        metrics = AgentMetrics(node=config.node)
        kube = KubeClient.from_config(args.kubeconfig)
        agent = Agent(config, kube, NvmlSource(), metrics)
        server = AgentHttpServer(args.metrics_bind, metrics.registry, agent.healthz, agent.readyz)
        plugin = csi_plugin(args, agent)
        if plugin is not None:
            plugin.start()
    except AgentError as err:
        log.error("%s", err)
        return 2
    except Exception as err:  # a kubeconfig that cannot be loaded, for instance
        log.error("cannot start the agent: %s", err)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("%s: stopping (MPS daemons get `quit`)", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    log.info("gpufrac agent on node %s; metrics on %s", config.node, args.metrics_bind)
    try:
        return agent.run(stop)
    finally:
        if plugin is not None:
            plugin.stop()
        server.stop()
