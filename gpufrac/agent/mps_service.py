"""`gpufrac mps --mode <mode>`: one mode's MPS control daemon, supervised, in a container of its own.

The chart runs one such container per mode in the gpufrac-mps DaemonSet (updateStrategy OnDelete), beside the
agent's DaemonSet: restarting, upgrading or OOM-killing the agent leaves the daemons and their clients alone; the
agent finds them through /proc (ExternalDaemon). This process restarts a daemon that dies, with backoff, and keeps
its state in `<log dir>/supervisor.json` for the agent to report; on SIGTERM (the pod deleted: uninstall, drain)
it sends the daemon `quit` and waits.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path

from gpufrac.agent import capabilities
from gpufrac.agent.errors import AgentError, NvmlError
from gpufrac.agent.model import DaemonState, DaemonStatus, Inventory
from gpufrac.agent.mps_config import daemon_spec
from gpufrac.agent.mps_status import write_status
from gpufrac.agent.supervisor import MpsSupervisor, RestartPolicy
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import DEFAULT_MPS_ROOT
from gpufrac.core.jsonlog import LEVELS, setup_logging

log = logging.getLogger("gpufrac.mps")

NVML_RETRY_SECONDS = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", type=ComputeMode, choices=list(ComputeMode), required=True,
                        help="the compute mode whose daemon this process runs")
    parser.add_argument("--mps-binary", default="nvidia-cuda-mps-control", help="the MPS control daemon executable")
    parser.add_argument("--mps-root", type=Path, default=Path(DEFAULT_MPS_ROOT),
                        help="host directory holding one pipe directory per mode")
    parser.add_argument("--mps-log-root", type=Path, default=Path("/var/log/gpufrac/mps"),
                        help="directory holding one MPS log directory per mode (and the supervisor's status file)")
    parser.add_argument("--mps-config-dir", type=Path, default=Path("/run/gpufrac/mps-config"),
                        help="where the daemon's MPS v3 TOML config is written")
    parser.add_argument("--proc-root", type=Path, default=Path("/proc"), help="/proc, to find stray MPS processes")
    parser.add_argument("--restart-backoff", type=float, default=5.0,
                        help="first delay before restarting a crashed daemon; doubles per crash")
    parser.add_argument("--restart-backoff-max", type=float, default=60.0, help="cap of that delay")
    parser.add_argument("--max-restarts", type=int, default=5,
                        help="crashes in a row before giving up (the container then exits and the kubelet restarts "
                             "it with its own backoff; 0: never give up)")
    parser.add_argument("--stable-after", type=float, default=300.0,
                        help="uptime after which the restart budget starts over")
    parser.add_argument("--quit-timeout", type=float, default=60.0,
                        help="seconds the daemon gets to exit after `quit` before it is killed")
    parser.add_argument("--log-level", default="info", choices=LEVELS, type=str.lower,
                        help="the least severe log lines written (JSON, on stderr)")


def _inventory(stop: threading.Event, mode: ComputeMode, log_dir: Path) -> Inventory | None:
    """The GPUs, once NVML answers (None: stopped while waiting). Decides the daemon's argv (MPS v3 or legacy)."""
    from gpufrac.agent.nvml import NvmlSource

    source = NvmlSource()
    while not stop.is_set():
        try:
            return source.inventory()
        except NvmlError as err:
            log.warning("%s; retrying in %.0fs", err, NVML_RETRY_SECONDS)
            _report(log_dir, DaemonStatus(mode, DaemonState.STARTING, False, 0, last_exit=f"waiting for NVML: {err}"))
            stop.wait(NVML_RETRY_SECONDS)
    return None


def _report(log_dir: Path, status: DaemonStatus) -> None:
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        write_status(log_dir, status)
    except OSError as err:
        log.warning("writing the status file in %s: %s", log_dir, err)


def serve(args: argparse.Namespace, stop: threading.Event) -> int:
    mode: ComputeMode = args.mode
    log_dir = args.mps_log_root / str(mode)
    inventory = _inventory(stop, mode, log_dir)
    if inventory is None:
        return 0
    if mode not in capabilities.modes_to_serve(inventory, (mode,)):
        reason = (f"not served on this node (driver {inventory.driver_version}"
                  f"{'' if inventory.gpus else ', no GPUs'}): {mode} needs CUDA 13.4 memory limits for its own daemon")
        log.warning("%s; idle", reason)
        _report(log_dir, DaemonStatus(mode, DaemonState.STOPPED, False, 0, last_exit=reason))
        stop.wait()
        return 0
    spec = daemon_spec(mode, mps_v3=capabilities.has_driver_memory_limits(inventory), binary=args.mps_binary,
                       mps_root=args.mps_root, log_root=args.mps_log_root, config_dir=args.mps_config_dir)
    policy = RestartPolicy(args.restart_backoff, max(args.restart_backoff_max, args.restart_backoff),
                           args.max_restarts, args.stable_after)
    supervisor = MpsSupervisor(spec, policy, quit_timeout=args.quit_timeout, proc_root=args.proc_root)
    supervisor.start()
    log.info("running the %s MPS daemon: %s", mode, " ".join(spec.argv))
    last: DaemonStatus | None = None
    while not stop.wait(0.2):
        status = supervisor.status()
        if status != last:
            _report(log_dir, status)
            last = status
        if status.state is DaemonState.FAILED:
            log.error("the %s MPS daemon %s", mode, status.failure)
            supervisor.stop()
            return 1
    supervisor.stop()
    _report(log_dir, supervisor.status())
    return 0


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("%s: stopping (the daemon gets `quit`)", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return serve(args, stop)
    except AgentError as err:
        log.error("%s", err)
        return 2
