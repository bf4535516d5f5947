"""`gpufrac mps --mode <mode>`: one mode's MPS control daemon, supervised, in a container of its own.

The chart runs one such container per mode in the gpufrac-mps DaemonSet (updateStrategy OnDelete), beside the
agent's DaemonSet: restarting, upgrading or OOM-killing the agent leaves the daemons and their clients alone; the
agent finds them through /proc (ExternalDaemon). This process restarts a daemon that dies, with backoff, and keeps
its state (and its build, for the agent's version skew) in `<log dir>/supervisor.json` for the agent to report; on
SIGTERM (the pod deleted: uninstall, `gpufrac mps-roll`) it sends the daemon `quit` and waits.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import threading
from pathlib import Path

from gpufrac.agent.decide import capabilities
from gpufrac.agent.decide.errors import AgentError, NvmlError
from gpufrac.agent.decide.model import DaemonState, DaemonStatus, Inventory
from gpufrac.agent.decide.mps_config import daemon_spec
from gpufrac.agent.edges.mps_status import write_status
from gpufrac.agent.edges.supervisor import MpsSupervisor
from gpufrac.agent.programs.daemon_options import add_daemon_arguments, daemon_settings, restart_policy
from gpufrac.agent.programs.stop_signal import stop_on_signals
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.buildinfo import build
from gpufrac.core.jsonlog import add_log_arguments, setup_logging

log = logging.getLogger("gpufrac.mps")

NVML_RETRY_SECONDS = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", type=ComputeMode, choices=list(ComputeMode), required=True,
                        help="the compute mode whose daemon this process runs")
    add_daemon_arguments(parser)
    parser.add_argument("--image", default="", metavar="REF",
                        help="the image this runs in (the chart sets it): reported with the version in the status "
                             "file, so the agent sees an MPS pod left on another image after an upgrade")
    add_log_arguments(parser)


def _inventory(stop: threading.Event, mode: ComputeMode, log_dir: Path, image: str) -> Inventory | None:
    """The GPUs, once NVML answers (None: stopped while waiting). Decides the daemon's argv (MPS v3 or legacy)."""
    from gpufrac.agent.edges.nvml import NvmlSource

    source = NvmlSource()
    while not stop.is_set():
        try:
            return source.inventory()
        except NvmlError as err:
            log.warning("%s; retrying in %.0fs", err, NVML_RETRY_SECONDS)
            _report(log_dir, DaemonStatus(mode, DaemonState.STARTING, False, 0, last_exit=f"waiting for NVML: {err}"),
                    image)
            stop.wait(NVML_RETRY_SECONDS)
    return None


def _report(log_dir: Path, status: DaemonStatus, image: str) -> None:
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        write_status(log_dir, dataclasses.replace(status, build=build(image)))
    except OSError as err:
        log.warning("writing the status file in %s: %s", log_dir, err)


def serve(args: argparse.Namespace, stop: threading.Event) -> int:
    mode: ComputeMode = args.mode
    settings, policy = daemon_settings(args), restart_policy(args)  # a bad option fails before NVML is waited for
    log_dir = args.mps_log_root / str(mode)
    inventory = _inventory(stop, mode, log_dir, args.image)
    if inventory is None:
        return 0
    if mode not in capabilities.modes_to_serve(inventory, (mode,)):
        reason = (f"not served on this node (driver {inventory.driver_version}"
                  f"{'' if inventory.gpus else ', no GPUs'}): {mode} needs CUDA 13.4 memory limits for its own daemon")
        log.warning("%s; idle", reason)
        _report(log_dir, DaemonStatus(mode, DaemonState.STOPPED, False, 0, last_exit=reason), args.image)
        stop.wait()
        return 0
    spec = daemon_spec(mode, mps_v3=capabilities.has_driver_memory_limits(inventory), binary=settings.binary,
                       mps_root=settings.mps_root, log_root=settings.log_root, config_dir=settings.config_dir)
    supervisor = MpsSupervisor(spec, policy, quit_timeout=settings.quit_timeout,
                               proc_root=settings.proc_root)
    supervisor.start()
    log.info("running the %s MPS daemon: %s", mode, " ".join(spec.argv))
    last: DaemonStatus | None = None
    while not stop.wait(0.2):
        status = supervisor.status()
        if status != last:
            _report(log_dir, status, args.image)
            last = status
        if status.state is DaemonState.FAILED:
            log.error("the %s MPS daemon %s", mode, status.failure)
            supervisor.stop()
            return 1
    supervisor.stop()
    _report(log_dir, supervisor.status(), args.image)
    return 0


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level, fmt=args.log_format)
    stop = stop_on_signals(log, "the daemon gets `quit`")
    try:
        return serve(args, stop)
    except AgentError as err:
        log.error("%s", err)
        return 2
