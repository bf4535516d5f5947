"""The table and the report: the rows in order, as text, and as JSON with the raw numbers."""

from __future__ import annotations

import json
import os
import socket
import sys
import textwrap
import time

from gpucheck.rows import FAIL, PASS, SKIPPED, Row
from gpucheck.session import Session


def row_order(row: Row) -> tuple[int, str]:
    digits = "".join(c for c in row.id if c.isdigit())
    return (int(digits) if digits else 99, row.id)


def render_table(rows: list[Row], header: str) -> str:
    width = max([len(r.name) for r in rows] + [5])
    lines = [header, f"{'#':<4} {'check':<{width}} {'status':<8} details", "-" * (width + 30)]
    for row in sorted(rows, key=row_order):
        wrapped = textwrap.wrap(row.details, 100) or [""]
        lines.append(f"{row.id:<4} {row.name:<{width}} {row.status:<8} {wrapped[0]}")
        lines.extend(f"{'':<4} {'':<{width}} {'':<8} {more}" for more in wrapped[1:])
    counts = {s: sum(1 for r in rows if r.status == s) for s in (PASS, FAIL, SKIPPED)}
    lines.append("-" * (width + 30))
    lines.append(f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIPPED]} skipped")
    return "\n".join(lines) + "\n"


def write_report(session: Session, table: str, interrupted: str | None) -> None:
    out = session.args.out
    seconds = time.monotonic() - session.began
    report = {
        "tool": "gpufrac gpu_check", "host": socket.gethostname(),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds)),
        "seconds": round(seconds, 1), "argv": sys.argv[1:], "workdir": session.root,
        "interrupted": interrupted, "failed": any(r.status == FAIL for r in session.rows),
        "checks": [{"id": r.id, "name": r.name, "status": r.status, "details": r.details, "numbers": r.numbers}
                   for r in sorted(session.rows, key=row_order)],
        "raw": session.raw, "table": table,
    }
    directory = os.path.dirname(os.path.abspath(out))
    os.makedirs(directory, exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=2, default=str)
        f.write("\n")
    with open(os.path.splitext(out)[0] + ".txt", "w") as f:
        f.write(table)
