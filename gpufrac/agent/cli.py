"""`gpufrac agent`: flags, and the process around the Agent (signals, HTTP server)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from gpufrac.agent.agent import Agent, AgentConfig
from gpufrac.agent.errors import AgentError, ConfigError
from gpufrac.agent.metrics import AgentMetrics
from gpufrac.agent.serve import AgentHttpServer
from gpufrac.agent.supervisor import RestartPolicy
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import DEFAULT_MPS_ROOT

log = logging.getLogger("gpufrac.agent")


def _modes(text: str) -> tuple[ComputeMode, ...]:
    try:
        return tuple(ComputeMode(m.strip()) for m in text.split(",") if m.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"{text}: expected a comma list of {', '.join(ComputeMode)}"
        ) from err


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node",
        default=os.environ.get("NODE_NAME"),
        help="this node's name (default: $NODE_NAME, from the downward API)",
    )
    parser.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster config, then $KUBECONFIG)"
    )
    parser.add_argument(
        "--modes",
        type=_modes,
        default=tuple(ComputeMode),
        help="compute modes to serve (default: time-slicing,sm-sharing)",
    )
    parser.add_argument(
        "--mps-binary", default="nvidia-cuda-mps-control", help="the MPS control daemon executable"
    )
    parser.add_argument(
        "--mps-root",
        type=Path,
        default=Path(DEFAULT_MPS_ROOT),
        help="host directory holding one pipe directory per mode (what the webhook mounts)",
    )
    parser.add_argument(
        "--mps-log-root",
        type=Path,
        default=Path("/var/log/gpufrac/mps"),
        help="directory holding one MPS log directory per mode",
    )
    parser.add_argument(
        "--mps-config-dir",
        type=Path,
        default=Path("/run/gpufrac/mps-config"),
        help="where the MPS v3 TOML config of each daemon is written",
    )
    parser.add_argument(
        "--proc-root", type=Path, default=Path("/proc"), help="the host's /proc (the agent needs hostPID)"
    )
    parser.add_argument(
        "--memory-limit-file",
        type=Path,
        default=Path("/sys/fs/cgroup/memory.max"),
        help="the agent container's cgroup memory limit, checked against the MPS budget",
    )
    parser.add_argument(
        "--metrics-bind", default=":9475",
        help="HOST:PORT serving /metrics, /healthz and /readyz; no host: every address of the pod's IP family"
    )
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between audits")
    parser.add_argument(
        "--evict-on-violation",
        action="store_true",
        help="evict a pod whose GPU processes break its limits (once per pod)",
    )
    parser.add_argument(
        "--restart-backoff",
        type=float,
        default=5.0,
        help="first delay before restarting a crashed MPS daemon; doubles per crash",
    )
    parser.add_argument("--restart-backoff-max", type=float, default=60.0, help="cap of that delay")
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=5,
        help="crashes in a row before giving up on a daemon (0: never give up)",
    )
    parser.add_argument(
        "--stable-after",
        type=float,
        default=300.0,
        help="uptime after which a daemon's restart budget starts over",
    )
    parser.add_argument(
        "--quit-timeout",
        type=float,
        default=60.0,
        help="seconds a daemon gets to exit after `quit` before it is killed",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")


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
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # the kubernetes client and urllib3 are chatty at INFO
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    from gpufrac.agent.kube import KubeClient
    from gpufrac.agent.nvml import NvmlSource

    try:
        config = config_from_args(args)
        metrics = AgentMetrics(node=config.node)
        kube = KubeClient.from_config(args.kubeconfig)
        agent = Agent(config, kube, NvmlSource(), metrics)
        server = AgentHttpServer(args.metrics_bind, metrics.registry, agent.healthz, agent.readyz)
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
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpufrac agent", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
