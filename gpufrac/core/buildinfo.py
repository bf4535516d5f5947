"""What is running, for the `gpufrac_build_info` series of every program."""

from __future__ import annotations

import platform
from importlib import metadata


def version() -> str:
    try:
        return metadata.version("gpufrac")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


def build(image: str = "") -> str:
    """The gpufrac build a process runs, as the agent compares it with the MPS pods': the version and, where the
    chart says it (--image), the image reference (a new tag of the same version is another build)."""
    return f"{version()} ({image})" if image else version()


def build_info() -> dict[str, str]:
    return {"version": version(), "python": platform.python_version()}
