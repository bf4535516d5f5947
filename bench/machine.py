"""What the numbers were measured on."""

from __future__ import annotations

import datetime as dt
import os
import platform
import sys
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load_average() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


def describe() -> dict[str, str]:
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": f"{os.cpu_count()} × {cpu_model()} ({len(os.sched_getaffinity(0))} usable)",
        "python": f"Python {sys.version.split()[0]} ({platform.python_implementation()})",
        "os": f"{platform.system()} {platform.release()}",
        "load": load_average(),
    }
