"""The command line: the arguments, a client subprocess's entry, and the run with its signals, table and exit status."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sys
import time
from typing import Any

from gpucheck.client.main import client_main
from gpucheck.report import render_table, write_report
from gpucheck.rows import FAIL, Row
from gpucheck.run import Run
from gpucheck.session import InterruptedRun, say


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gpu_check.pyz", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="gpufrac's hardware check: MPS pinned limits, CUDA 13.4 memory limits, compute modes, pod "
                    "isolation and NVML attribution on this node's GPU. Run as root on an idle GPU node.",
        epilog="Exit status: 0 when no check FAILed, 1 when one did, 2 for bad arguments, 130 when interrupted.")
    parser.add_argument("--mps-control", help="the nvidia-cuda-mps-control to use (default: the one on PATH)")
    parser.add_argument("--nvml", default="libnvidia-ml.so.1", help="NVML library path (default: %(default)s)")
    parser.add_argument("--cuda", default="libcuda.so.1",
                        help="CUDA driver library path, or 'none' to skip the CUDA checks (default: %(default)s)")
    parser.add_argument("--gpu", type=int, default=0, help="index of the GPU to check (default: %(default)s)")
    parser.add_argument("--out", default="gpu-check-report.json",
                        help="where to write the JSON report; the table goes next to it as .txt (default: %(default)s)")
    parser.add_argument("--workdir", help="scratch directory for the daemons' pipe and log directories "
                                          "(default: a new one under $TMPDIR, removed afterwards)")
    parser.add_argument("--keep-workdir", action="store_true", help="keep the scratch directory (logs) afterwards")
    parser.add_argument("--only", type=lambda s: set(s.split(",")), default=set(),
                        help="run only these checks, e.g. --only 2,4 (the inventory and the daemons always run)")
    parser.add_argument("--spin-seconds", type=float, default=3.0,
                        help="how long one client's kernel spins alone in check 4 (default: %(default)s)")
    parser.add_argument("--budget", type=float, default=480.0,
                        help="seconds after which remaining checks are skipped; stopping the daemons comes after "
                             "(default: %(default)s, so that the whole run stays under ten minutes)")
    parser.add_argument("--quit-timeout", type=float, default=30.0,
                        help="seconds a daemon gets to exit after quit before it is killed (default: %(default)s)")
    parser.add_argument("--linger", type=float, default=0.0,
                        help="wait this long after starting the daemons, before the checks (to inspect them)")
    parser.add_argument("--crictl", help="the crictl for the runtime checks (8a, 8b; default: the one on PATH)")
    parser.add_argument("--runtime-endpoint",
                        default=os.environ.get("CONTAINER_RUNTIME_ENDPOINT", "unix:///run/containerd/containerd.sock"),
                        help="the node's CRI socket (default: $CONTAINER_RUNTIME_ENDPOINT or %(default)s)")
    parser.add_argument("--image", help="an image already on the node with sh, ls and sleep, for the runtime checks' "
                                        "containers (default: gpufrac's own, as crictl lists it)")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.client:
        return client_main(json.loads(args.client))
    run = Run(args)
    session = run.session
    interrupted: str | None = None

    def on_signal(signum: int, _frame: Any) -> None:
        raise InterruptedRun(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    session.log(f"gpufrac gpu check on {socket.gethostname()}; scratch directory {session.root}")
    try:
        run.run()
    except InterruptedRun as err:
        interrupted = str(err)
        session.log(f"interrupted by {interrupted}: stopping the clients and daemons")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the cleanup short
        run.cleanup()
    run.daemons.row()
    if interrupted:
        session.add(Row("9", "run", FAIL, f"interrupted by {interrupted}"))
    inv = session.raw.get("inventory", {})
    header = (f"gpufrac gpu check: {socket.gethostname()}, driver {inv.get('driver_version', '?')}, "
              f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, {time.monotonic() - session.began:.0f}s")
    table = render_table(session.rows, header)
    try:
        write_report(session, table, interrupted)
        written = f"report: {args.out} (table: {os.path.splitext(args.out)[0]}.txt)"
    except OSError as err:
        written = f"could not write the report to {args.out}: {err}"
    if not args.keep_workdir and not args.workdir:
        shutil.rmtree(session.root, ignore_errors=True)
    say("\n" + table + written + "\n")
    if interrupted:
        return 130
    return 1 if any(r.status == FAIL for r in session.rows) else 0


def run_and_exit() -> None:
    """The .pyz's entry point (zipapp's __main__ calls it and drops what it returns)."""
    sys.exit(main())
