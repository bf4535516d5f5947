"""No source file above a number of lines (`make lint`: 500 in gpufrac/): one line per file that has more.

Usage: python hack/file_lines.py --max 500 DIR...   (*.py below each DIR; generated stubs are not ours)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SKIP_PARTS = {"generated", "__pycache__"}


def too_long(dirs: list[Path], most: int) -> list[tuple[Path, int]]:
    found = []
    for base in dirs:
        for path in sorted(base.rglob("*.py")):
            if SKIP_PARTS & set(path.parts):
                continue
            with path.open("rb") as f:
                lines = sum(1 for _ in f)
            if lines > most:
                found.append((path, lines))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/file_lines.py", description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, required=True, dest="most", help="the most lines a file may have")
    parser.add_argument("dirs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.dirs if not d.is_dir()]
    if missing:
        parser.error(f"not a directory: {', '.join(missing)}")
    found = too_long(args.dirs, args.most)
    for path, lines in found:
        print(f"{path}: {lines} lines (at most {args.most}: split it by job)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
