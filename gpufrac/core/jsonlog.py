"""The one log format of every gpufrac program: one JSON object per line (stdlib only).

Schema: `time` (UTC, milliseconds, `2026-12-01T09:00:00.123Z`), `level`, `logger`, `message`, then the fields of
the current `log_context` (the webhook's admission `uid`), then the `extra` fields the call passes, then
`exception` when there is one. `--log-format text` writes the same fields for a person at a terminal:
`<time> <level> <logger>: <message> key=value ...`, the exception on the lines after.
"""

from __future__ import annotations

import argparse
import contextvars
import datetime as dt
import itertools
import json
import logging
import logging.config
import math
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

LEVELS = ("debug", "info", "warning", "error")  # what --log-level accepts
FORMATS = ("json", "text")  # what --log-format accepts
# Libraries that are chatty at INFO: they log at WARNING and above whatever the program's level.
QUIET_LOGGERS = ("kubernetes", "urllib3")

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}
_OWN_ATTRIBUTES = len(vars(logging.LogRecord("", 0, "", 0, "", (), None)))
_context: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "gpufrac_log_context", default=MappingProxyType({}))


# json.dumps(entry, default=str) would build this encoder for every line.
_ENCODER = json.JSONEncoder(default=str)


_SECOND: tuple[int, str] = (-1, "")  # the last whole second written, and its text


def timestamp(created: float) -> str:
    """UTC with milliseconds. The seconds' text is made once per second (lines come many a second); the
    microseconds round half to even, carrying into the second, as datetime.fromtimestamp does."""
    fraction, whole = math.modf(created)
    micros = round(fraction * 1e6)
    if created < 0:
        moment = dt.datetime.fromtimestamp(created, dt.UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    second = int(whole) + (micros >= 1_000_000)
    micros %= 1_000_000
    cached = _SECOND
    if cached[0] != second:
        cached = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
        globals()["_SECOND"] = cached
    return f"{cached[1]}.{micros // 1000:03d}Z"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """The line's fields after the message: the log context's, then the call's `extra`."""
    fields: dict[str, Any] = dict(_context.get())
    attributes = vars(record).items()
    if type(record) is logging.LogRecord:  # its own attributes come first, then the call's `extra`
        attributes = itertools.islice(attributes, _OWN_ATTRIBUTES, None)  # type: ignore[assignment]
    fields.update({k: v for k, v in attributes if k not in _STANDARD and k[:1] != "_"})
    return fields


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(_fields(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return _ENCODER.encode(entry)


class TextFormatter(logging.Formatter):
    """The same fields as JsonFormatter, for reading in a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={v if isinstance(v, str) and v and ' ' not in v else _ENCODER.encode(v)}"
                          for k, v in _fields(record).items())
        line = (f"{timestamp(record.created)} {record.levelname.lower():<7} {record.name}: {record.getMessage()}"
                f"{' ' + fields if fields else ''}")
        return f"{line}\n{self.formatException(record.exc_info)}" if record.exc_info else line


@contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Fields every line logged inside the block carries (in this thread or task)."""
    token = _context.set({**_context.get(), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def log_config(level: str, stream: str = "ext://sys.stderr", fmt: str = "json") -> dict[str, Any]:
    """A logging.config.dictConfig for this format (gunicorn takes it as its logconfig_dict). The handler is named
    `json` whichever format it writes."""
    formatter = TextFormatter if fmt == "text" else JsonFormatter
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.{formatter.__name__}"}},
        "handlers": {"json": {"class": "logging.StreamHandler", "formatter": "json", "stream": stream}},
        "root": {"level": level.upper(), "handlers": ["json"]},
        "loggers": {name: {"level": "WARNING"} for name in QUIET_LOGGERS},
    }


def setup_logging(level: str, stream: str = "ext://sys.stderr", fmt: str = "json") -> None:
    logging.config.dictConfig(log_config(level, stream, fmt))


def add_log_arguments(parser: argparse.ArgumentParser, *, level: str = "info", stream: str = "stderr") -> None:
    """--log-level and --log-format, the same for every command."""
    parser.add_argument("--log-level", default=level, choices=LEVELS, type=str.lower,
                        help=f"the least severe log lines written (on {stream})")
    parser.add_argument("--log-format", default="json", choices=FORMATS, type=str.lower,
                        help="json: one JSON object per line (for log collectors); text: for reading in a terminal")
