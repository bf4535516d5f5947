"""Row 5, pods: sm-sharing clients in their own mount, IPC and PID namespaces, seeing only what gpufrac delivers."""

from __future__ import annotations

import os
from typing import Any

from gpucheck.checks.daemons import Daemons
from gpucheck.client_process import Client, ClientError
from gpucheck.contract import (
    ENV_PINNED_MEM_LIMIT,
    GPUFRAC_MPS_ROOT,
    SM_SHARING,
    TIME_SLICING,
    daemon_layout,
    format_pinned_mem_limit,
)
from gpucheck.judge import judge_pod, judge_probe, probe_max_mib
from gpucheck.pairs import zip_pairs
from gpucheck.rows import FAIL, PASS, SKIPPED, Row
from gpucheck.session import Session


class Pods:
    DELIVERED = "5a", "two sm-sharing pods, delivered mounts"
    PRIVATE = "5b", "sm-sharing pod, private /dev/shm"

    def __init__(self, session: Session, daemons: Daemons) -> None:
        self.s = session
        self.daemons = daemons
        self.shm_marker = f"/dev/shm/gpufrac-gpu-check-{os.getpid()}"

    def spec(self, shm_delivered: bool) -> dict[str, Any]:
        """What a pod's mount namespace hides and what gpufrac delivers into it."""
        s = self.s
        sm = daemon_layout(s.root, SM_SHARING)
        ts = daemon_layout(s.root, TIME_SLICING)
        hide = [s.root] + [p for p in ("/tmp/nvidia-mps", "/var/log/nvidia-mps", os.path.dirname(GPUFRAC_MPS_ROOT))
                           if os.path.isdir(p)]
        return {"hide": hide, "deliver": [{"source": sm.pipe_dir, "target": sm.pipe_dir}],
                "shm_delivered": shm_delivered, "pipe_dir": sm.pipe_dir, "shm_marker": self.shm_marker,
                "expect_hidden": [sm.log_dir, ts.pipe_dir, s.clients_dir], "mps_control": s.node.mps_control}

    def run(self) -> None:
        s = self.s
        a, b = s.node.limits()
        reason = self.daemons.problem(SM_SHARING) or (None if s.node.unshare else s.node.unshare_reason)
        if reason:
            s.skip((self.DELIVERED, self.PRIVATE), reason)
            return
        with open(self.shm_marker, "w") as marker:
            marker.write("gpufrac gpu check: visible only where the daemon's /dev/shm is\n")
        host_ns = {ns: os.readlink(f"/proc/self/ns/{ns}") for ns in ("ipc", "mnt", "pid")}
        self.row(*self.DELIVERED, [(a, "a"), (b, "b")], host_ns, shm_delivered=True)
        if s.node.no_cuda() is None and s.rows[-1].status != PASS:
            s.add(Row(*self.PRIVATE, SKIPPED, "no answer: pods with the daemon's /dev/shm did not work either (5a)"))
            return
        self.row(*self.PRIVATE, [(a, "c")], host_ns, shm_delivered=False)

    def remove_marker(self) -> None:
        try:
            os.unlink(self.shm_marker)
        except OSError:
            pass

    def row(self, row_id: str, name: str, pods: list[tuple[int, str]], host_ns: dict[str, str],
            shm_delivered: bool) -> None:
        s = self.s
        pipe = daemon_layout(s.root, SM_SHARING).pipe_dir
        cuda = s.node.no_cuda() is None
        clients = []
        for limit, label in pods:
            spec: dict[str, Any] = {"pod": self.spec(shm_delivered)}
            if cuda:
                spec.update(probe_max_mib=probe_max_mib(limit), hold=True)
            else:
                spec["cuda"] = None
            clients.append(s.start_client(f"pod-{label}", spec, s.client_env(
                pipe, {ENV_PINNED_MEM_LIMIT: format_pinned_mem_limit(limit, 1)}), pod=True))
        numbers: dict[str, Any] = {"shm_delivered": shm_delivered, "pods": []}
        with s.row_of(row_id, name, clients, numbers):
            facts = [c.wait("pod", s.bounded(60))["facts"] for c in clients]
            problems = [f"pod {label}: {p}" for f, (_, label) in zip_pairs(facts, pods)
                        for p in judge_pod(f, host_ns, shm_delivered)]
            numbers["pods"] = facts
            shm = "the daemon's" if shm_delivered else "a private"
            isolation = (f"{len(pods)} pod(s): own PID/IPC/mount namespaces, pid 1, see the pipe directory "
                         f"(control daemon reached), not the logs or the other mode's pipe directory, {shm} /dev/shm")
            if problems:
                s.add(Row(row_id, name, FAIL, "the pod emulation is wrong: " + "; ".join(problems), numbers))
                return
            if not cuda:
                s.add(Row(row_id, name, SKIPPED, f"{s.node.no_cuda()}; namespaces checked: {isolation}", numbers))
                return
            self.cuda(row_id, name, clients, pods, numbers, isolation, shm_delivered)

    def cuda(self, row_id: str, name: str, clients: list[Client], pods: list[tuple[int, str]],
             numbers: dict[str, Any], isolation: str, shm_delivered: bool) -> None:
        s = self.s
        try:
            _, results = s.group(clients)
        except ClientError as err:
            numbers["error"] = err.event
            if shm_delivered:
                s.add(Row(row_id, name, FAIL, str(err), numbers))
            else:
                numbers["shm_needed"] = True
                s.add(Row(row_id, name, PASS, f"answer: the daemon's /dev/shm IS needed: without it the client "
                                              f"fails ({err})", numbers))
            return
        verdicts = [judge_probe(limit, r["probe"]) for (limit, _), r in zip_pairs(pods, results)]
        numbers["clients"] = [{"limit_mib": limit, "probe": {k: v for k, v in r["probe"].items() if k != "chunks"}}
                              for (limit, _), r in zip_pairs(pods, results)]
        texts = "; ".join(f"pod {label}: {text}" for (_, label), (_, text) in zip_pairs(pods, verdicts))
        held = all(v[0] == PASS for v in verdicts)
        if not shm_delivered:
            numbers["shm_needed"] = False
            status = PASS if held else FAIL
            s.add(Row(row_id, name, status, f"answer: the daemon's /dev/shm is NOT needed: the client connects "
                                            f"without it; {texts}", numbers))
            return
        s.add(Row(row_id, name, PASS if held else FAIL, f"{texts}; {isolation}", numbers))
