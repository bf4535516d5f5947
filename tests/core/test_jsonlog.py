"""One log schema for every program: JSON lines, UTC time with milliseconds, level, logger, message, extras."""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

from gpufrac.core.jsonlog import JsonFormatter, log_context, timestamp

ROOT = Path(__file__).resolve().parents[2]
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def _lines(emit) -> list[dict]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("gpufrac.test")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        emit(logger)
    finally:
        logger.removeHandler(handler)
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_the_time_is_utc_with_milliseconds() -> None:
    assert timestamp(1796115600.1234) == "2026-12-01T09:00:00.123Z"


def test_one_schema_with_the_extra_fields_and_the_context() -> None:
    def emit(log: logging.Logger) -> None:
        log.info("plain")
        with log_context(uid="u-1"):
            log.warning("in a review %s", "x", extra={"endpoint": "mutate"})
        log.info("after")

    first, second, third = _lines(emit)
    assert set(first) == {"time", "level", "logger", "message"} and TIME.fullmatch(first["time"])
    assert (first["level"], first["logger"], first["message"]) == ("info", "gpufrac.test", "plain")
    assert second == {**second, "level": "warning", "message": "in a review x", "uid": "u-1", "endpoint": "mutate"}
    assert "uid" not in third


def test_an_exception_is_one_line_too() -> None:
    def emit(log: logging.Logger) -> None:
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")

    [line] = _lines(emit)
    assert line["message"] == "failed" and "ValueError: boom" in line["exception"]


def test_the_agent_logs_in_the_same_schema() -> None:
    result = subprocess.run([sys.executable, "-m", "gpufrac", "agent"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60, env={"PATH": "/usr/bin"})
    assert result.returncode == 2
    [line] = [json.loads(text) for text in result.stderr.splitlines()]
    assert (line["level"], line["logger"]) == ("error", "gpufrac.agent") and TIME.fullmatch(line["time"])
    assert "--node is required" in line["message"]


def test_the_text_format_writes_the_same_fields_for_a_terminal() -> None:
    from gpufrac.core.jsonlog import TextFormatter
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter())
    logger = logging.getLogger("gpufrac.text")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        with log_context(uid="u-1"):
            logger.warning("daemon %s restarted", "sm-sharing", extra={"mode": "sm-sharing", "note": "two words"})
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    first, second, *trace = stream.getvalue().splitlines()
    stamp, rest = first.split(" ", 1)
    assert TIME.match(stamp)
    assert rest == 'warning gpufrac.text: daemon sm-sharing restarted uid=u-1 mode=sm-sharing note="two words"'
    assert second.endswith("error   gpufrac.text: failed") and trace[-1] == "ValueError: boom"


def test_every_command_takes_log_format_text(tmp_path: Path) -> None:
    """`--log-format text` on a command as its users run it: lines a person reads, not JSON."""
    done = subprocess.run([sys.executable, "-m", "gpufrac", "mps-roll", "--log-format", "text", "--log-level", "info",
                           "--kubeconfig", str(tmp_path / "missing")], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "gpufrac mps-roll: cannot load the cluster's configuration" in done.stderr
    from gpufrac.cli import build_parser
    for argv in (["webhook", "--certs", "x"], ["agent"], ["mps", "--mode", "sm-sharing"], ["agent-withdraw",
                 "--namespace", "n", "--agent-daemonset", "a", "--agent-selector", "s"]):
        args = build_parser().parse_args([*argv, "--log-format", "text"])
        assert args.log_format == "text", argv
