"""The MPS daemon options `gpufrac agent` (the daemons as its children) and `gpufrac mps` (one daemon in a pod of
its own) share: their names, defaults (DaemonSettings, RestartPolicy) and help, written once."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufrac.agent.decide.errors import ConfigError
from gpufrac.agent.decide.mps_config import DaemonSettings
from gpufrac.agent.edges.supervisor import RestartPolicy

DAEMON = DaemonSettings()
RESTART = RestartPolicy()


def add_daemon_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mps-binary", default=DAEMON.binary, help="the MPS control daemon executable")
    parser.add_argument("--mps-root", type=Path, default=DAEMON.mps_root, metavar="PATH",
                        help="host directory holding one pipe directory per mode, <PATH>/<mode> (the webhook's "
                             "--mps-root)")
    parser.add_argument("--mps-log-root", type=Path, default=DAEMON.log_root, metavar="PATH",
                        help="directory holding one MPS log directory per mode (and `gpufrac mps`'s status file)")
    parser.add_argument("--mps-config-dir", type=Path, default=DAEMON.config_dir, metavar="PATH",
                        help="where the MPS v3 TOML config of each daemon is written")
    parser.add_argument("--proc-root", type=Path, default=DAEMON.proc_root, metavar="PATH",
                        help="the host's /proc (hostPID), to find the MPS daemons and their servers")
    parser.add_argument("--restart-backoff", type=float, default=RESTART.initial_backoff, metavar="SECONDS",
                        help="first delay before restarting a crashed MPS daemon; doubles per crash")
    parser.add_argument("--restart-backoff-max", type=float, default=RESTART.max_backoff, metavar="SECONDS",
                        help="cap of that delay")
    parser.add_argument("--max-restarts", type=int, default=RESTART.max_restarts, metavar="N",
                        help="crashes in a row before giving up on a daemon (0: never give up; `gpufrac mps` then "
                             "exits and the kubelet restarts it with its own backoff)")
    parser.add_argument("--stable-after", type=float, default=RESTART.stable_after, metavar="SECONDS",
                        help="uptime after which a daemon's restart budget starts over")
    parser.add_argument("--quit-timeout", type=float, default=DAEMON.quit_timeout, metavar="SECONDS",
                        help="time a daemon gets to exit after `quit` before it is killed")


def daemon_settings(args: argparse.Namespace) -> DaemonSettings:
    return DaemonSettings(args.mps_binary, args.mps_root, args.mps_log_root, args.mps_config_dir, args.proc_root,
                          args.quit_timeout)


def restart_policy(args: argparse.Namespace) -> RestartPolicy:
    """Raises ConfigError for a backoff that is not positive or a negative restart count."""
    if args.restart_backoff <= 0 or args.max_restarts < 0:
        raise ConfigError("--restart-backoff must be positive, --max-restarts at least 0")
    return RestartPolicy(args.restart_backoff, max(args.restart_backoff_max, args.restart_backoff),
                         args.max_restarts, args.stable_after)
