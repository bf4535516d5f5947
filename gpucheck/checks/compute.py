"""Row 4, compute modes: two spinning clients finish together under sm-sharing and take turns without it."""

from __future__ import annotations

from typing import Any

from gpucheck.checks.daemons import Daemons
from gpucheck.contract import SM_SHARING
from gpucheck.judge import judge_compute
from gpucheck.rows import SKIPPED, Row
from gpucheck.session import Session


class Compute:
    def __init__(self, session: Session, daemons: Daemons) -> None:
        self.s = session
        self.daemons = daemons

    def run(self, row_id: str, mode: str | None) -> None:
        """4a: two spinning clients finish together under sm-sharing; 4b, 4c: they take turns."""
        s = self.s
        expect = "together" if mode == SM_SHARING else "turns"
        label = "no MPS" if mode is None else f"{mode} daemon"
        name = f"compute, {label}: {expect}"
        reason = s.node.no_cuda() or (self.daemons.problem(mode) if mode else None)
        if reason:
            s.add(Row(row_id, name, SKIPPED, reason))
            return
        if mode is None and s.node.compute_mode == "Exclusive_Process":
            s.add(Row(row_id, name, SKIPPED, "the GPU is in EXCLUSIVE_PROCESS mode: two non-MPS clients cannot "
                                             "share it"))
            return
        calibration = s.node.calibration
        iterations = calibration["iterations"]
        clients = [s.start_client(f"compute-{row_id}-{x}", {"spin_iterations": iterations},
                                  s.client_env(self.daemons.pipe_dir(mode))) for x in "ab"]
        numbers: dict[str, Any] = {"iterations": iterations, "solo_s": calibration["solo_s"]}
        with s.row_of(row_id, name, clients, numbers):
            _, results = s.group(clients, result_timeout=s.args.spin_seconds * 6 + 60)
            span = max(r["t_done"] for r in results) - min(r["t_go"] for r in results)
            numbers.update(span_s=span, clients=[r["spin"] for r in results])
            status, text = judge_compute(expect, calibration["solo_s"], span)
            durations = ", ".join(f"{r['spin']['host_s']:.2f}s" for r in results)
            s.add(Row(row_id, name, status, f"{text}; each client's kernel took {durations}", numbers))
