"""How the check starts itself again as a client subprocess (`python3 <program> --client <spec>`): the program is the
.pyz this package was loaded from (the one file a person copies to a node), or, in a checkout, the package's
__main__.py."""

from __future__ import annotations

import os
import sys

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def program_path() -> str:
    # inside a zipapp a module's file is <archive>/gpucheck/program.py, and the archive is a file
    archive = os.path.dirname(PACKAGE_DIR)
    if os.path.isfile(archive):
        return archive
    return os.path.join(PACKAGE_DIR, "__main__.py")


PROGRAM = program_path()  # now, as the check starts: a relative path means the directory it started in


def client_argv() -> list[str]:
    return [sys.executable, PROGRAM]
