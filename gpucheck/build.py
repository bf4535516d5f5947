"""Builds the GPU check into one file: this package as a zipapp (PEP 441) that a node's python3 (3.8+) runs alone,
`python3 gpu_check.pyz`. Standard library only, like the check: `python3 -m gpucheck.build [--out PATH]`
(`make gpu-check-pyz`); it prints the path it wrote. The .pyz is build output, never committed."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import zipapp

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(os.path.dirname(PACKAGE_DIR), ".e2e", "gpu-check", "gpu_check.pyz")
# zipapp writes the archive's __main__.py to call this; it ignores a return value, so the function exits itself
ENTRY_POINT = "gpucheck.cli:run_and_exit"


def left_out(directory: str, names: list[str]) -> set[str]:
    """What the node does not need: caches, the wrapper, this builder; the package's own .py files go in."""
    return {name for name in names if not (name.endswith(".py") or os.path.isdir(os.path.join(directory, name)))
            or name == "__pycache__" or (directory == PACKAGE_DIR and name == "build.py")}


def build(out: str = DEFAULT_OUT) -> str:
    """Writes the .pyz to `out` (whole or not at all: a run that copies it meanwhile never sees half a file)."""
    out = os.path.abspath(out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpucheck-pyz-") as staging:
        shutil.copytree(PACKAGE_DIR, os.path.join(staging, "gpucheck"), ignore=left_out)
        partial = f"{out}.{os.getpid()}.tmp"
        zipapp.create_archive(staging, partial, interpreter="/usr/bin/env python3", main=ENTRY_POINT,
                              compressed=True)
    os.replace(partial, out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m gpucheck.build", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="where to write the .pyz (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        print(build(args.out))
    except OSError as err:
        print(f"gpucheck.build: cannot write {args.out}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
