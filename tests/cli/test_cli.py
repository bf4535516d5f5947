"""The `gpufrac` command line as an operator meets it: version, help, environment, errors in one line."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from gpufrac.cli import build_parser
from gpufrac.flags import FlagParser, mirrored

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ("certs", "webhook", "review", "agent")


def gpufrac(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpufrac", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env=env)


def test_version_is_the_installed_packages() -> None:
    result = gpufrac("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"gpufrac {metadata.version('gpufrac')}"


def _flags() -> list[tuple[argparse.ArgumentParser, argparse.Action, str]]:
    """(its parser, the flag, its variable) of every flag the environment can set."""
    parser = build_parser()
    assert isinstance(parser, FlagParser)
    return [(p, f.action, f.variable) for p, f in mirrored(parser) if f.variable]


def test_every_flag_has_a_meaning_its_default_and_its_variable_in_help(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "10000")  # no wrapping: each flag's help is on one line
    flags = _flags()
    assert len(flags) > 40  # every subcommand's flags, rotate's too
    for parser, action, variable in flags:
        text = parser.format_help()
        assert action.help, f"{action.option_strings} has no help"
        assert f"[${variable}" in text, f"{variable} is not in {parser.prog} --help"
        if action.default not in (None, False, [], ""):
            assert "default" in (action.help or "") or f"(default: {action.default})" in text, \
                f"{action.option_strings}'s default is not in {parser.prog} --help"


def test_each_flag_is_named_after_its_variable() -> None:
    names = {variable for _, _, variable in _flags()}
    assert {"GPUFRAC_LOG_LEVEL", "GPUFRAC_BIND", "GPUFRAC_CERTS", "GPUFRAC_NODE", "GPUFRAC_MPS_ROOT",
            "GPUFRAC_SCHEDULER_USER", "GPUFRAC_REQUIRE_ENFORCING_NODE", "GPUFRAC_WEBHOOK_CONFIG"} <= names


def test_the_environment_sets_flags_and_the_command_line_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFRAC_CERTS", "/etc/certs")  # satisfies a required flag
    monkeypatch.setenv("GPUFRAC_LOG_LEVEL", "WARNING")
    monkeypatch.setenv("GPUFRAC_WORKERS", "3")
    monkeypatch.setenv("GPUFRAC_REQUIRE_ENFORCING_NODE", "true")
    monkeypatch.setenv("GPUFRAC_SCHEDULER_USER", "u1, u2")
    args = build_parser("webhook").parse_args(["webhook"])
    assert (args.certs, args.log_level, args.workers) == ("/etc/certs", "warning", 3)
    assert args.require_enforcing_node is True and args.scheduler_user == ["u1", "u2"]
    args = build_parser("webhook").parse_args(["webhook", "--workers", "5", "--log-level", "debug",
                                               "--no-require-enforcing-node"])
    assert (args.workers, args.log_level, args.require_enforcing_node) == (5, "debug", False)
    assert build_parser("webhook").parse_args(["webhook", "--scheduler-user", "u3"]).scheduler_user == ["u3"]
    assert build_parser("webhook").parse_args(
        ["webhook", "--scheduler-user", "u3", "--scheduler-user", "u4"]).scheduler_user == ["u3", "u4"]
    monkeypatch.setenv("GPUFRAC_INTERVAL", "2.5")
    assert build_parser("agent").parse_args(["agent"]).interval == 2.5


def test_a_bad_variable_is_a_one_line_error_naming_it() -> None:
    result = gpufrac("agent", "--node", "n", env={"GPUFRAC_INTERVAL": "soon", "PATH": "/usr/bin"})
    assert result.returncode == 2 and "--interval: invalid float value: 'soon'" in result.stderr
    result = gpufrac("webhook", "--certs", "x", env={"GPUFRAC_REQUIRE_ENFORCING_NODE": "maybe", "PATH": "/usr/bin"})
    assert result.returncode != 0 and "GPUFRAC_REQUIRE_ENFORCING_NODE='maybe'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["webhook", "agent"])
def test_log_level_is_a_choice(command: str) -> None:
    result = gpufrac(command, "--log-level", "loud", "--certs", "x")
    assert result.returncode == 2 and "invalid choice: 'loud'" in result.stderr
    assert "debug" in result.stderr and "error" in result.stderr


def test_a_port_in_use_is_one_line_with_the_bind_hint(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = gpufrac("webhook", "--certs", str(tmp_path), "--bind", f"127.0.0.1:{port}")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and f"127.0.0.1:{port} is already in use" in result.stderr
    assert "BIND=" in result.stderr and "--bind" in result.stderr


def test_certs_without_out_says_where_it_writes(tmp_path: Path) -> None:
    result = gpufrac("certs", cwd=tmp_path)
    assert result.returncode == 0
    out = (tmp_path / "certs" / "dev").resolve()
    assert f"wrote {out}/ca.crt" in result.stdout and "no --out" in result.stdout
    assert (out / "tls.key").is_file()
    assert "--out" in " ".join(gpufrac("certs", "--help").stdout.split())


def test_make_run_installs_the_package_without_the_test_tools(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    plan = subprocess.run(["make", "-n", "run", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout
    assert f"{venv}/bin/python -m pip install -q -c constraints.txt -e ." in plan
    assert "[test]" not in plan
    test_plan = subprocess.run(["make", "-n", "lint", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout
    assert "-e '.[test]'" in test_plan and "lint-imports" in test_plan and "mypy" in test_plan
