"""The pure decision path, in process: bytes → parse → mutate → apply patch → validate, per review."""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import re
import statistics
import time
import timeit
from dataclasses import dataclass, replace
from typing import Any

import jsonpatch

from bench.reviews import SeedReview, pod, review, sized_annotations
from gpufrac.webhook.decide import admission
from gpufrac.webhook.decide.policy import Policy
from gpufrac.webhook.decide.review import build_response, parse_review


def decide(raw: bytes, path: str, policy: Policy) -> dict[str, Any]:
    """What the Flask handler does for one review, less HTTP, logging and metrics: parse, decide, respond."""
    request = parse_review(json.loads(raw))
    outcome = (admission.validate if path == "/validate" else admission.mutate)(request, policy)
    return build_response(request.uid, allowed=outcome.allowed, message=outcome.message, patch=outcome.patch,
                          warnings=outcome.warnings)


def _with_object(request, obj):
    from dataclasses import replace
    return replace(request, obj=obj)


def full_path(raw: bytes, policy: Policy) -> bool:
    """parse review, admission.mutate, apply patch, admission.validate (the brief's in-process path)."""
    request = parse_review(json.loads(raw))
    outcome = admission.mutate(request, policy)
    patched = jsonpatch.apply_patch(request.obj, outcome.patch) if outcome.patch else request.obj
    return admission.validate(_with_object(request, patched), policy).allowed


@dataclass(frozen=True)
class SizeRow:
    containers: int
    annotations: int
    fractional: int
    body_bytes: int
    patch_ops: int
    us_per_review: float


def sized(policy: Policy, quick: bool) -> list[SizeRow]:
    # Cost by pod size: each container that fits a memory key holds a fraction, which the chart's default
    # (KAI's binder binds one fraction container per pod) denies; measured as with a binder that binds each.
    policy = replace(policy, allow_multiple_fraction_containers=True)
    rows = []
    repeat = 3 if quick else 7
    for containers in (1, 10, 50):
        for count in (1, 64):
            annotations, fractional = sized_annotations(containers, count)
            raw = json.dumps(review(pod("sized", annotations, containers)), separators=(",", ":")).encode()
            request = parse_review(json.loads(raw))
            outcome = admission.mutate(request, policy)
            if not outcome.allowed or not full_path(raw, policy):
                raise RuntimeError(f"sized pod ({containers} containers, {count} annotations) was denied: "
                                   f"{outcome.message}")
            timer = timeit.Timer(lambda raw=raw: full_path(raw, policy))
            number, _ = timer.autorange()  # at least 0.2 s per sample
            number = max(1, number // (4 if quick else 1))
            best = min(timer.repeat(repeat=repeat, number=number)) / number
            rows.append(SizeRow(containers, count, fractional, len(raw), len(outcome.patch), best * 1e6))
    return rows


@dataclass(frozen=True)
class SeedRow:
    name: str
    body_bytes: int
    best_us: float
    p50_us: float
    p99_us: float


def seeds(reviews: list[SeedReview], policy: Policy, quick: bool) -> list[SeedRow]:
    """Each seed review through `decide` (what the handler runs), one call at a time: best, p50 and p99."""
    rows = []
    n = 300 if quick else 3000
    for r in reviews:
        raw = r.raw
        for _ in range(50):
            decide(raw, r.path, policy)
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            decide(raw, r.path, policy)
            samples.append(time.perf_counter() - t0)
        samples.sort()
        rows.append(SeedRow(r.name, len(raw), samples[0] * 1e6, statistics.median(samples) * 1e6,
                            samples[int(0.99 * (len(samples) - 1))] * 1e6))
    return rows


def profile(reviews: list[SeedReview], policy: Policy, quick: bool, top: int = 10) -> tuple[str, str, str]:
    """cProfile over the seed mix through `decide`: top functions by own time and by cumulative time, and where
    the function with the most own time is called from."""
    rounds = 200 if quick else 2000
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(rounds):
        for r in reviews:
            decide(r.raw, r.path, policy)
    profiler.disable()
    n = rounds * len(reviews)
    return _top(profiler, "tottime", top, n), _top(profiler, "cumulative", top, n), _callers(profiler, n)


def _callers(profiler: cProfile.Profile, reviews: int) -> str:
    """Callers of the function with the most own time, from outside its module where there are any (deepcopy
    recurses through copy.py's helpers)."""
    stats = pstats.Stats(profiler).stats
    top, (_cc, _nc, _tt, _ct, callers) = max(stats.items(), key=lambda kv: kv[1][2])
    filename, _line, func = top
    rows = [(caller, ct) for caller, (_c, _n, _t, ct) in callers.items() if caller[0] != filename]
    if not rows:
        rows = [(caller, ct) for caller, (_c, _n, _t, ct) in callers.items() if caller != top]
    rows.sort(key=lambda r: r[1], reverse=True)
    parts = [f"`{c[2]} ({_short(c[0])}:{c[1]})` {ct / reviews * 1e6:.0f} µs/review" for c, ct in rows[:6]]
    return f"`{func}` ({_short(filename)}) is called from: " + "; ".join(parts) + "."


def _top(profiler: cProfile.Profile, key: str, top: int, reviews: int) -> str:
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats(key)
    total = stats.total_tt
    lines = ["| # | function | calls/review | own µs/review | cumulative µs/review | own % |",
             "|---|---|---|---|---|---|"]
    entries = sorted(stats.stats.items(), key=lambda kv: kv[1][2 if key == "tottime" else 3], reverse=True)
    shown = 0
    for (filename, line, func), (_cc, nc, tt, ct, _callers) in entries:
        if key == "cumulative" and func in ("<built-in method builtins.exec>", "decide", "<module>"):
            continue
        shown += 1
        where = _short(filename)
        name = func if filename == "~" else f"{func} ({where}:{line})"
        lines.append(f"| {shown} | `{name}` | {nc / reviews:.1f} | {tt / reviews * 1e6:.1f} | "
                     f"{ct / reviews * 1e6:.1f} | {tt / total * 100:.1f} |")
        if shown == top:
            break
    return "\n".join(lines)


def _short(filename: str) -> str:
    match = re.search(r"/lib/python3\.\d+/(?:site-packages/)?(.*)$", filename)
    if match:
        return match[1]
    return "/".join(filename.split("/")[-2:])
