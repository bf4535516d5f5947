"""The webhook server's logging, on public extension points: gunicorn's `logconfig_dict` setting, a
`logging.StreamHandler` subclass, logging's documented switches. (gunicorn's `logger_class` is server.AccessLogger:
only server.py imports gunicorn, .importlinter.)"""

from __future__ import annotations

import logging
import os
import select
from typing import Any

from gpufrac.core.jsonlog import log_config


class LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """One write(2) per log line. A line up to PIPE_BUF bytes is written whole by the kernel even when other
    threads write at the same time (stdout is a pipe in a container), so it takes no lock: review threads do not
    queue behind each other's writes. Longer lines take the handler's lock."""

    def handle(self, record: logging.LogRecord) -> bool:
        if not self.filter(record):
            return False
        try:
            line = (self.format(record) + "\n").encode("utf-8", "backslashreplace")
            fd = self.stream.fileno()
            if len(line) <= select.PIPE_BUF:
                os.write(fd, line)
                return True
            self.acquire()
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                self.release()
        except Exception:
            self.handleError(record)
        return True


def server_log_config(level: str, fmt: str = "json") -> dict[str, Any]:
    """The one log format (gpufrac.core.jsonlog) on stdout, through LineHandler; gunicorn's own lines too."""
    config = log_config(level, "ext://sys.stdout", fmt)
    config["handlers"]["json"]["class"] = f"{__name__}.LineHandler"
    config["loggers"].update({
        "gunicorn.error": {"level": level.upper(), "handlers": ["json"], "propagate": False},
        "gunicorn.access": {"level": "WARNING", "handlers": ["json"], "propagate": False},
    })
    return config


def skip_record_lookups() -> None:
    """A log record needs no thread or process lookup: our formatter writes none of them. These are the logging
    module's documented switches (the "Optimization" section of its HOWTO). The caller's file and line would be
    skipped too by the private `logging._srcfile`, which gpufrac no longer touches (docs/performance.md)."""
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
