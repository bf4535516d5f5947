"""The judgements: pure functions from measured numbers to a status (unit-tested in tests/gpucheck)."""

from __future__ import annotations

from typing import Any

from gpucheck.contract import MIB
from gpucheck.nvml import NVML_DEVICE_MEMORY_LIMIT_MAX
from gpucheck.rows import FAIL, PASS, SKIPPED

HELD_MIN_FRACTION = 0.5  # a client held to its limit allocates at least this share of it (context memory aside)
PROBE_HEADROOM = 1.5  # a probe stops at limit x this (+ 256 MiB): reaching it means the limit did not hold
TOGETHER_MAX_RATIO = 1.35  # two clients "finish together": both done within this x the time one takes alone
TURNS_MIN_RATIO = 1.65  # two clients "take turns": both done only after this x the time one takes alone


def probe_max_mib(limit_mib: int) -> int:
    return int(limit_mib * PROBE_HEADROOM) + 256


def judge_probe(limit_mib: int, probe: dict[str, Any]) -> tuple[str, str]:
    """A client that allocated in chunks until the first failure: held to `limit_mib`, or not (SKIPPED: the device
    does not allocate its way, stopped_by "unsupported")."""
    allocated = probe.get("allocated_mib", 0)
    stopped = probe.get("stopped_by")
    if stopped == "unsupported":
        return SKIPPED, f"this device does not allocate this way ({probe.get('error_name', '?')})"
    if stopped == "max" or allocated > limit_mib:
        return FAIL, f"not held: allocated {allocated} MiB with a {limit_mib} MiB limit"
    if stopped != "oom":
        return FAIL, (f"allocation failed after {allocated} MiB with {probe.get('error_name', '?')}, not "
                      f"CUDA_ERROR_OUT_OF_MEMORY (limit {limit_mib} MiB)")
    if allocated < limit_mib * HELD_MIN_FRACTION:
        return FAIL, (f"out of memory after only {allocated} MiB of a {limit_mib} MiB limit (less than "
                      f"{HELD_MIN_FRACTION:.0%})")
    return PASS, f"{allocated}/{limit_mib} MiB then OUT_OF_MEMORY"


def worst(statuses: list[str]) -> str:
    """A row's status from its clients': FAIL if one failed, else SKIPPED if one could not be checked, else PASS."""
    return FAIL if FAIL in statuses else SKIPPED if SKIPPED in statuses else PASS


def judge_compute(expect: str, solo_s: float, span_s: float) -> tuple[str, str]:
    """expect "together" (sm-sharing) or "turns" (time-slicing): two clients' span against one client's time."""
    ratio = span_s / solo_s if solo_s > 0 else float("inf")
    text = f"both done after {span_s:.2f}s, one alone {solo_s:.2f}s: {ratio:.2f}x"
    if expect == "together":
        ok = ratio <= TOGETHER_MAX_RATIO
        return (PASS if ok else FAIL), text + ("" if ok else f" (together means <= {TOGETHER_MAX_RATIO}x)")
    ok = ratio >= TURNS_MIN_RATIO
    return (PASS if ok else FAIL), text + ("" if ok else f" (taking turns means >= {TURNS_MIN_RATIO}x)")


def judge_devices(seen: list[str], expected: str | None) -> tuple[str, str]:
    """A container's /dev/nvidia* names against the one GPU device it should have (None: no GPU at all)."""
    gpus = sorted(name for name in seen if name[len("nvidia"):].isdigit())
    shown = ", ".join(f"/dev/{g}" for g in gpus) or "no GPU device"
    if expected is None:
        return (PASS, "no GPU device") if not gpus else (FAIL, f"sees {shown}")
    if gpus != [expected]:
        return FAIL, f"sees {shown}, not exactly /dev/{expected}"
    control = sorted(set(seen) - set(gpus))
    return PASS, f"sees exactly /dev/{expected}" + (f" (and {', '.join(control)})" if control else "")


def judge_container_limits(read_back: dict[str, int], request_mib: int, limit_mib: int) -> tuple[str, str]:
    """NVML's CUDA 13.4 limits on a container's cgroup against the env it was given (soft = request, hard = limit)."""
    soft, hard = read_back.get("soft", 0), read_back.get("hard", NVML_DEVICE_MEMORY_LIMIT_MAX)
    if (soft, hard) == (request_mib * MIB, limit_mib * MIB):
        return PASS, f"NVML holds its cgroup to {request_mib} MiB soft, {limit_mib} MiB hard"
    if (soft, hard) == (0, NVML_DEVICE_MEMORY_LIMIT_MAX):
        return FAIL, ("no CUDA 13.4 limit on its cgroup: the CDI device's apply-cuda-memory-limits hook did not run "
                      "(NVIDIA's CDI spec without it, or a toolkit older than 1.20.1)")
    return FAIL, (f"its cgroup's limits are {soft // MIB} MiB soft, {hard // MIB} MiB hard, not {request_mib} and "
                  f"{limit_mib} MiB")


def judge_pod(facts: dict[str, Any], host_ns: dict[str, str], shm_delivered: bool) -> list[str]:
    """What is wrong with a "pod" client's view of the node (empty when it is isolated as a pod would be)."""
    problems = []
    if facts.get("pid") != 1:
        problems.append(f"not in its own PID namespace (pid {facts.get('pid')})")
    for ns in ("ipc", "mnt", "pid"):
        if facts.get("ns", {}).get(ns) == host_ns.get(ns):
            problems.append(f"shares the host's {ns} namespace")
    if not facts.get("control_socket"):
        problems.append("the delivered pipe directory has no control socket")
    for path, hidden in sorted(facts.get("hidden", {}).items()):
        if not hidden:
            problems.append(f"sees {path}")
    if facts.get("shm_marker_visible") != shm_delivered:
        problems.append("sees the daemon's /dev/shm" if not shm_delivered else "does not see the delivered /dev/shm")
    probe = facts.get("control_probe") or {}
    if probe.get("rc") != 0:
        problems.append(f"could not reach the control daemon through the delivered pipe directory "
                        f"(rc {probe.get('rc')}: {probe.get('output', '').strip()[:120]})")
    return problems
