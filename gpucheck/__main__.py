"""`python3 -m gpucheck` from a checkout, or `python3 gpucheck/__main__.py` (how the clients start there). The .pyz
gets its own __main__ from zipapp (gpucheck/build.py)."""

from __future__ import annotations

import os
import sys

if not __package__:  # run as a file: the checkout's root goes first on the path, not this directory
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from gpucheck.cli import main

if __name__ == "__main__":
    sys.exit(main())
