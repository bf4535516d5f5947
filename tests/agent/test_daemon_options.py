"""`gpufrac agent` and `gpufrac mps` run the same MPS daemons: one set of daemon options, defaults written once."""

from __future__ import annotations

import threading

import pytest

from gpufrac.agent.decide.errors import ConfigError
from gpufrac.agent.decide.mps_config import DaemonSettings
from gpufrac.agent.edges.supervisor import RestartPolicy
from gpufrac.agent.programs.daemon_options import daemon_settings, restart_policy
from gpufrac.agent.programs.mps_service import serve
from gpufrac.agent.programs.node_agent import config_from_args
from gpufrac.cli import build_parser

DAEMON_OPTIONS = ("mps_binary", "mps_root", "mps_log_root", "mps_config_dir", "proc_root", "restart_backoff",
                  "restart_backoff_max", "max_restarts", "stable_after", "quit_timeout")


def test_both_programs_take_the_daemon_options_with_the_same_defaults():
    agent = build_parser().parse_args(["agent", "--node", "n1"])
    mps = build_parser().parse_args(["mps", "--mode", "sm-sharing"])
    assert {name: getattr(agent, name) for name in DAEMON_OPTIONS} == {name: getattr(mps, name)
                                                                      for name in DAEMON_OPTIONS}
    config = config_from_args(agent)
    assert daemon_settings(mps) == DaemonSettings(config.mps_binary, config.mps_root, config.mps_log_root,
                                                  config.mps_config_dir, config.proc_root, config.quit_timeout)
    assert restart_policy(mps) == config.restart_policy == RestartPolicy()


def test_an_option_given_to_either_program_reaches_its_daemons_settings():
    args = ["--mps-root", "/run/x", "--quit-timeout", "7", "--restart-backoff", "9", "--restart-backoff-max", "3"]
    agent = config_from_args(build_parser().parse_args(["agent", "--node", "n1", *args]))
    mps = build_parser().parse_args(["mps", "--mode", "sm-sharing", *args])
    assert (str(agent.mps_root), agent.quit_timeout) == (str(daemon_settings(mps).mps_root), 7.0) == ("/run/x", 7.0)
    # a cap below the first delay is the first delay, in both
    assert agent.restart_policy == restart_policy(mps) == RestartPolicy(9.0, 9.0, 5, 300.0)


@pytest.mark.parametrize("option", [("--restart-backoff", "0"), ("--max-restarts", "-1")])
def test_a_bad_restart_option_is_refused_by_both_programs_before_anything_starts(option: tuple[str, str]):
    with pytest.raises(ConfigError, match="--restart-backoff must be positive, --max-restarts at least 0"):
        config_from_args(build_parser().parse_args(["agent", "--node", "n1", *option]))
    stop = threading.Event()
    stop.set()  # were NVML waited for first, serve would return 0 here instead of refusing
    with pytest.raises(ConfigError, match="--restart-backoff must be positive"):
        serve(build_parser().parse_args(["mps", "--mode", "sm-sharing", *option]), stop)
