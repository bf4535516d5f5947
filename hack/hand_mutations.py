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
RECLAIMER = "gpufrac/agent/node/reclaimer.py"
TOTALS = "gpufrac/agent/node/container_totals.py"
RECLAIM = "gpufrac/agent/decide/reclaim.py"
BACKOFFS = "gpufrac/agent/node/backoffs.py"
EVICTIONS = "gpufrac/agent/node/evictions.py"
NODE_LOOP = "gpufrac/agent/node/node_loop.py"
NVML = "gpufrac/agent/edges/nvml.py"
WEBHOOK = "gpufrac/webhook/decide/mutation.py"
TESTS = ("tests/agent/test_guarantee.py", "tests/agent/test_reclaim.py", "tests/agent/test_reclaim_victims.py",
         "tests/agent/test_reclaim_owed_once.py", "tests/webhook/test_mutation.py")


@dataclass(frozen=True)
class Mutation:
    name: str
    edits: tuple[tuple[str, str, str], ...]  # (file, text, replacement): each text must occur exactly once
    tests: tuple[str, ...] = TESTS  # what pytest runs against it (the test that kills it, where one is named)
    timeout: float | None = None  # seconds, where the mutant loops for ever (else --timeout)


G = "tests/agent/test_guarantee.py::"


MUTATIONS = (
    Mutation("stop after the first refused candidate (the loop)", (
        (RECLAIMER, '"pod again after reclaim.gracePeriodSeconds")\n',
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
        (RECLAIMER, "        if not plan.candidates:\n", "        if False:\n"),
    )),
    Mutation("kill an already-killed process again", (
        (TOTALS, "if pid is None or (pid, started[pid]) in self._killed:", "if pid is None:"),
    )),
    # issue 45
    Mutation("a refused eviction of a second pod of a backed-off controller drops the running back-off", (
        (BACKOFFS, "        if before is None:\n            self._until.pop(label, None)\n",
         "        if True:\n            self._until.pop(label, None)\n"),
    ), (G + "test_a_refused_eviction_keeps_the_controllers_running_back_off",)),
    Mutation("policy off reports every candidate instead of those it would evict", (
        (RECLAIMER, "for candidate in reclaim.to_evict(plan):", "for candidate in plan.candidates:"),
    ), (G + "test_off_reports_only_the_pods_it_would_evict",)),
    Mutation("reclaim's loop does not count the pass's evictions as going", (
        (RECLAIMER, "going = self.evictions.this_pass ", "going = set(self.evictions.this_pass) "),
    ), (G + "test_f3_one_eviction_per_pod_per_pass_across_gpus",), 20.0),  # it evicts the same pod for ever
    Mutation("over-limit evictions not remembered for reclaim", (
        (EVICTIONS, "            self.this_pass.add(uid)\n", "            pass\n"),
    ), (G + "test_f3_over_limit_evict_and_reclaim_evict_the_same_pod_once",), 20.0),
    Mutation("evict though the back-off label was not written (fail open)", (
        (BACKOFFS, "        if not self._publish():\n", "        if not self._publish() and False:\n"),
    ), (G + "test_f4_a_back_off_label_that_cannot_be_written_means_no_eviction",)),
    Mutation("the node's label publishing says it wrote what it did not", (
        (NODE_LOOP, "        return self.publisher.try_publish_labels(self._labels(self._enforced))",
         "        self.publisher.try_publish_labels(self._labels(self._enforced))\n        return True"),
    ), (G + "test_f4_a_back_off_label_that_cannot_be_written_means_no_eviction",)),
    Mutation("a claim's pod gets a back-off label", (
        (RECLAIMER, "owner = None if victim.pod_uid in self._claim_pods else victim.owner", "owner = victim.owner"),
    ), (G + "test_f4_a_claims_pod_gets_no_back_off_label",)),
    Mutation("an unread claim pod is a candidate (fail open)", (
        (RECLAIMER, "PodFacts(tenant.pod, 0, 0.0, unread=True)", "PodFacts(tenant.pod, 0, 0.0)"),
    ), (G + "test_f5_a_claim_pod_that_cannot_be_read_is_not_evicted",)),
    Mutation("no UID precondition on an eviction", (
        (EVICTIONS, "uid=uid, grace_seconds=self._grace_seconds", "uid='', grace_seconds=self._grace_seconds"),
    ), (G + "test_f7_a_pod_of_the_same_name_made_since_is_not_evicted",)),
    Mutation("the victim's grace period not passed", (
        (EVICTIONS, "uid=uid, grace_seconds=self._grace_seconds", "uid=uid, grace_seconds=None"),
    ), (G + "test_f7_every_eviction_names_the_pods_uid_and_the_victims_grace_period",)),
    Mutation("the driver-ended Event forgets who was above its request", (
        (RECLAIMER, "self._above = soft_limits.above_request(shares, self._attributed)", "self._above = {}"),
    ), (G + "test_where_the_driver_holds_requests_a_process_gone_while_above_its_request_gets_an_event",)),
    Mutation("NVML's reading takes no reserve", (
        (NVML, "            reserved = int(info.reserved)\n", "            reserved = 0\n"),
    ), (G + "test_usable_memory_label_and_metric_from_the_fake_reserve",)),
    Mutation("NVML's reading lists every GPU's processes under the first", (
        (NVML, "uuid = _text(pynvml.nvmlDeviceGetUUID(handle))\n                    processes.extend(",
         "uuid = _text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0)))\n"
         "                    processes.extend("),
    ), (G + "test_usable_memory_label_and_metric_from_the_fake_reserve",)),  # GPU B's MPS context
    Mutation("the webhook adds the back-off affinity whatever the agent does", (
        (WEBHOOK, "    if policy.keep_off_reclaimed_nodes:\n", "    if True:\n"),
    ), ("tests/webhook/test_mutation.py::test_no_back_off_affinity_where_no_agent_writes_the_label",)),
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
            run = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                                  *mutation.tests], cwd=copy, capture_output=True, text=True,
                                 timeout=mutation.timeout or timeout)
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
