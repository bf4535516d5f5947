"""Row 7: the MPS control daemons, one per mode served, started before the checks and stopped after them."""

from __future__ import annotations

from gpucheck.contract import daemon_layout
from gpucheck.mps_daemon import Daemon
from gpucheck.processes import mps_server_pids
from gpucheck.rows import FAIL, PASS, SKIPPED, Row
from gpucheck.session import Session


class Daemons:
    def __init__(self, session: Session) -> None:
        self.s = session
        self.by_mode: dict[str, Daemon] = {}

    def start(self) -> None:
        s, node = self.s, self.s.node
        for mode in node.served:
            assert node.mps_control is not None
            daemon = Daemon(node.mps_control, daemon_layout(s.root, mode), node.driver_limits, s.base_env())
            self.by_mode[mode] = daemon
            started = daemon.start()
            s.log(f"{mode} MPS daemon: {' '.join(started['argv'])} -> "
                  f"{'up' if started['up'] else 'NOT up'} in {started['seconds']}s (pid {started['pid']})")

    def stop(self) -> None:
        for mode, daemon in self.by_mode.items():
            if daemon.proc is not None and not daemon.stopped:
                stopped = daemon.stop(self.s.args.quit_timeout)
                self.s.log(f"{mode} MPS daemon stopped: {stopped['how']} (exit {stopped['exit']}, "
                           f"{stopped['seconds']}s, strays killed {stopped['strays_killed']})")

    def problem(self, mode: str) -> str | None:
        if mode not in self.s.node.served:
            return f"no {mode} daemon: gpufrac serves {mode} only on drivers with the CUDA 13.4 memory limits"
        daemon = self.by_mode.get(mode)
        if daemon is None or not daemon.up:
            return f"the {mode} MPS daemon is not up"
        return None

    def pipe_dir(self, mode: str | None) -> str:
        """The mode's pipe directory; without a mode, one with no daemon (the client runs without MPS)."""
        return self.by_mode[mode].layout.pipe_dir if mode else self.s.no_mps_dir

    def server_pids(self, mode: str | None = None) -> list[int]:
        """The MPS servers of every daemon, or of one mode's: a daemon takes commands for its own servers only."""
        return mps_server_pids([d.layout.pipe_dir for m, d in self.by_mode.items() if mode in (None, m)])

    def row(self) -> None:
        if not self.by_mode:
            reason = "no MPS control binary" if not self.s.node.mps_control else "no daemon was started"
            self.s.add(Row("7", "MPS daemons start and stop", SKIPPED, reason))
            return
        problems, parts = [], []
        numbers = {mode: {"started": d.started, "stopped": d.stopped} for mode, d in self.by_mode.items()}
        for mode, daemon in self.by_mode.items():
            start, stop = daemon.started, daemon.stopped
            parts.append(f"{mode}: up in {start.get('seconds')}s, {stop.get('how')} in {stop.get('seconds')}s")
            if not start.get("up"):
                problems.append(f"{mode} never came up (exit {start.get('exit')}: {start.get('log', '')[:160]})")
            if stop.get("how") != "quit" or stop.get("exit") != 0:
                problems.append(f"{mode} did not stop on quit ({stop.get('how')}, exit {stop.get('exit')})")
            if stop.get("strays_killed"):
                problems.append(f"{mode} left MPS processes behind: {stop['strays_killed']}")
        self.s.add(Row("7", "MPS daemons start and stop", FAIL if problems else PASS,
                       "; ".join(problems + parts), numbers))
