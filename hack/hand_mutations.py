"""The hand-made mutations of issue 31 against the guarantee's tests: each must make them fail (`make mutation`).

mutmut mutates the pure decisions one token at a time; these are the mistakes a person would make in the loop that
carries them out: stop after the first refused candidate, ignore pods that are terminating, drop the no-candidate
path, kill an already-killed process again. Each is applied to a copy of the repository (the working tree is never
touched) and the tests that cover it run there; a mutation the tests do not notice fails this script.

    python hack/hand_mutations.py            # all of them
    python hack/hand_mutations.py --list     # their names
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
TESTS = ("tests/agent/test_guarantee.py", "tests/agent/test_reclaim.py", "tests/agent/test_reclaim_victims.py")


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
    args = parser.parse_args()
    if args.list:
        print("\n".join(m.name for m in MUTATIONS))
        return 0
    failed, seconds, last = caught(Mutation("none", ()), args.timeout)
    if failed:  # the copy must pass unmutated, or a failure would prove nothing
        print(f"the tests fail without any mutation ({seconds:.1f} s): {last}", file=sys.stderr)
        return 1
    survived = []
    for mutation in MUTATIONS:
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
