"""The hand-made mutations of issues 31 and 45 against the guarantee's tests: each must make them fail (`make
mutation`).

mutmut mutates the pure decisions one token at a time; these are the mistakes a person would make in the edges that
carry them out and that mutmut does not reach: the eviction loop, the over-limit action, the back-offs and the
node's label publishing, one eviction per pod per pass, the UID precondition and grace period, the fail-closed
reads, the driver-ended Event, NVML's reading and the webhook's back-off affinity. Each is applied to a copy of the
repository (the working tree is never touched) and the tests that cover it run there; a mutation the tests do not
notice fails this script.

    python hack/hand_mutations.py              # all of them
    python hack/hand_mutations.py --list       # their names
    python hack/hand_mutations.py --only off   # those whose name holds "off"
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("gpufrac", "tests", "testkit", "e2e", "examples", "pyproject.toml")
GUARANTEE = "gpufrac/agent/programs/guarantee.py"
RECLAIM = "gpufrac/agent/decide/reclaim.py"
BACKOFFS = "gpufrac/agent/programs/backoffs.py"
EVICTIONS = "gpufrac/agent/programs/evictions.py"
NODE_LOOP = "gpufrac/agent/programs/node_loop.py"
NVML = "gpufrac/agent/edges/nvml.py"
WEBHOOK = "gpufrac/webhook/decide/mutation.py"
TESTS = ("tests/agent/test_guarantee.py", "tests/agent/test_reclaim.py", "tests/agent/test_reclaim_victims.py",
         "tests/agent/test_reclaim_owed_once.py", "tests/webhook/test_mutation.py")


@dataclass(frozen=True)
class Mutation:
    name: str
    edits: tuple[tuple[str, str, str], ...]  # (file, text, replacement): each text must occur exactly once


MUTATIONS = (
    Mutation("stop after the first refused candidate (the loop)", (
        (GUARANTEE, '"pod again after reclaim.gracePeriodSeconds")\n',
         '"pod again after reclaim.gracePeriodSeconds")\n                break\n'),
    )),
    Mutation("stop after the first refused candidate (the decision)", (
        (RECLAIM, "    skip = set(refused) | gone\n", "    skip = set(refused) | gone\n    if refused:\n"
                                                      "        return None\n"),
    )),
    Mutation("ignore terminating pods", (
        (RECLAIM, "if c.terminating or c.pod_uid in gone)", "if c.pod_uid in gone)"),
        (RECLAIM, "if c.pod_uid not in skip and not c.terminating)", "if c.pod_uid not in skip)"),
    )),
    Mutation("drop the no-candidate path", (
        (GUARANTEE, "        if not plan.candidates:\n", "        if False:\n"),
    )),
    Mutation("kill an already-killed process again", (
        (GUARANTEE, "if pid is None or (pid, started[pid]) in self._killed:", "if pid is None:"),
    )),
    # issue 45
    Mutation("a refused eviction of a second pod of a backed-off controller drops the running back-off", (
        (BACKOFFS, "        if before is None:\n            self._until.pop(label, None)\n",
         "        if True:\n            self._until.pop(label, None)\n"),
    )),
    Mutation("policy off reports every candidate instead of those it would evict", (
        (GUARANTEE, "for candidate in reclaim.to_evict(plan):", "for candidate in plan.candidates:"),
    )),
    Mutation("a pod evicted twice in one pass (no per-pass memory)", (
        (EVICTIONS, "        if uid in self.this_pass:\n", "        if False:\n"),
    )),
    Mutation("evict though the back-off label was not written (fail open)", (
        (BACKOFFS, "        if not self._publish():\n", "        if not self._publish() and False:\n"),
    )),
    Mutation("the node's label publishing says it wrote what it did not", (
        (NODE_LOOP, "        return self.publisher.try_publish_labels(self._labels(self._enforced))",
         "        self.publisher.try_publish_labels(self._labels(self._enforced))\n        return True"),
    )),
    Mutation("a claim's pod gets a back-off label", (
        (GUARANTEE, "owner = None if victim.pod_uid in self._claim_pods else victim.owner", "owner = victim.owner"),
    )),
    Mutation("an unread claim pod is a candidate (fail open)", (
        (GUARANTEE, "PodFacts(tenant.pod, 0, 0.0, unread=True)", "PodFacts(tenant.pod, 0, 0.0)"),
    )),
    Mutation("no UID precondition on an eviction", (
        (EVICTIONS, "uid=uid, grace_seconds=self._grace_seconds", "uid='', grace_seconds=self._grace_seconds"),
    )),
    Mutation("the victim's grace period not passed", (
        (EVICTIONS, "uid=uid, grace_seconds=self._grace_seconds", "uid=uid, grace_seconds=None"),
    )),
    Mutation("the driver-ended Event forgets who was above its request", (
        (GUARANTEE, "self._above = soft_limits.above_request(shares, self._attributed)", "self._above = {}"),
    )),
    Mutation("NVML's reading takes no reserve", (
        (NVML, "            reserved = int(info.reserved)\n", "            reserved = 0\n"),
    )),
    Mutation("NVML's reading lists every GPU's processes under the first", (
        (NVML, "uuid = _text(pynvml.nvmlDeviceGetUUID(handle))\n                    processes.extend(",
         "uuid = _text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0)))\n"
         "                    processes.extend("),
    )),
    Mutation("the webhook adds the back-off affinity whatever the agent does", (
        (WEBHOOK, "    if policy.keep_off_reclaimed_nodes:\n", "    if True:\n"),
    )),
)


def apply(copy: Path, mutation: Mutation) -> None:
    for file, text, replacement in mutation.edits:
        path = copy / file
        source = path.read_text()
        if source.count(text) != 1:
            raise SystemExit(f"{mutation.name}: {file} no longer holds {text.strip()!r} exactly once: update "
                             f"{Path(__file__).name}")
        path.write_text(source.replace(text, replacement))


def caught(mutation: Mutation, timeout: float) -> tuple[bool, float, str]:
    """Whether the tests fail with the mutation applied, how long they took, and pytest's last line."""
    with tempfile.TemporaryDirectory(prefix="gpufrac-mutation-") as tmp:
        copy = Path(tmp)
        for name in COPIED:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("__pycache__", "mutants"))
            else:
                shutil.copy2(source, copy / name)
        apply(copy, mutation)
        started = time.monotonic()
        try:
            run = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *TESTS],
                                 cwd=copy, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return True, time.monotonic() - started, "timed out (a loop that never ends: caught)"
        lines = [line for line in run.stdout.splitlines() if line.strip()]
        return run.returncode != 0, time.monotonic() - started, lines[-1] if lines else run.stderr.strip()[-200:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="name the mutations and stop")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds the tests may run per mutation")
    parser.add_argument("--only", default="", metavar="TEXT", help="only the mutations whose name holds TEXT")
    args = parser.parse_args()
    if args.list:
        print("\n".join(m.name for m in MUTATIONS))
        return 0
    chosen = [m for m in MUTATIONS if args.only in m.name]
    failed, seconds, last = caught(Mutation("none", ()), args.timeout)
    if failed:  # the copy must pass unmutated, or a failure would prove nothing
        print(f"the tests fail without any mutation ({seconds:.1f} s): {last}", file=sys.stderr)
        return 1
    survived = []
    for mutation in chosen:
        killed, seconds, last = caught(mutation, args.timeout)
        print(f"{'killed  ' if killed else 'SURVIVED'} {mutation.name} ({seconds:.1f} s): {last}")
        if not killed:
            survived.append(mutation.name)
    if survived:
        print(f"{len(survived)} hand-made mutation(s) survived: {', '.join(survived)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
