"""What is running, for the `gpufrac_build_info` series of every program."""

from __future__ import annotations

import platform
from importlib import metadata


def version() -> str:
    try:
        return metadata.version("gpufrac")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


def build_info() -> dict[str, str]:
    return {"version": version(), "python": platform.python_version()}
