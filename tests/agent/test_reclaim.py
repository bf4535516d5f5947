"""Reclaim above request, as a pure decision over plain values and a clock (gpufrac.agent.decide.reclaim)."""

from __future__ import annotations

import pytest

from gpufrac.agent.decide.attribution import AttributedProcess
from gpufrac.agent.decide.model import GpuMemory, GpuProcess, RunningContainer
from gpufrac.agent.decide.reclaim import (
    Episode,
    GpuShare,
    PodFacts,
    ReclaimPolicy,
    ReclaimSettings,
    candidates,
    decide,
    shares,
    to_evict,
)
from gpufrac.core.contract import MIB
from testkit.agent import UUID_A, UUID_B, cid, container, gpu_info

TOTAL_MIB = 80000
GPUS = {UUID_A: gpu_info(0, UUID_A, TOTAL_MIB), UUID_B: gpu_info(1, UUID_B, TOTAL_MIB)}
EVICT = ReclaimSettings(ReclaimPolicy.EVICT, grace_seconds=30.0, hysteresis_bytes=256 * MIB)
OFF = ReclaimSettings(ReclaimPolicy.OFF, grace_seconds=30.0, hysteresis_bytes=256 * MIB)


def tenant(pod: str, n: int, *, request_mib: int, limit_mib: int | None = None, gpu: str = UUID_A) -> RunningContainer:
    return container("app", pod=pod, uid=f"u-{pod}", container_id=cid(n), request_mib=request_mib,
                     limit_mib=limit_mib or request_mib * 2, devices=(gpu,))


A = tenant("a", 1, request_mib=40000)
B = tenant("b", 2, request_mib=20000, limit_mib=60000)
C = tenant("c", 3, request_mib=5000, limit_mib=30000)


def world(*used_mib: tuple[RunningContainer, int], reserved_mib: int = 0, other_mib: int = 0,
          gpu: str = UUID_A) -> list[GpuShare]:
    """One GPU where each container's one process uses its MiB, plus memory used by processes of no fraction."""
    attributed = [AttributedProcess(GpuProcess(gpu, 1000 + i, mib * MIB, 0), c, None)
                  for i, (c, mib) in enumerate(used_mib)]
    used = (sum(mib for _, mib in used_mib) + other_mib) * MIB
    total = TOTAL_MIB * MIB
    memory = {gpu: GpuMemory(gpu, total, reserved_mib * MIB, used, total - reserved_mib * MIB - used)}
    return shares(attributed, [c for c, _ in used_mib], GPUS, memory, {gpu: other_mib * MIB})


FACTS = {"u-a": PodFacts("a", 0, 1000.0), "u-b": PodFacts("b", 0, 2000.0), "u-c": PodFacts("c", 0, 3000.0)}


def run(passes: list[list[GpuShare]], settings: ReclaimSettings = EVICT, step: float = 10.0,
        facts: dict[str, PodFacts] = FACTS) -> list[tuple[float, list]]:
    """Each pass `step` seconds after the last: the plans made, with the time they were made."""
    episodes: dict[str, Episode] = {}
    made = []
    for i, gpu_shares in enumerate(passes):
        plans, episodes = decide(gpu_shares, facts, episodes, i * step, settings)
        if plans:
            made.append((i * step, plans))
    return made


def test_the_guarantee_and_the_shortfall():
    # A uses 10000 of its 40000 MiB request (30000 owed); B uses 45000, 25000 above its 20000 request
    [share] = world((A, 10000), (B, 45000), reserved_mib=600)
    assert share.owed_bytes == 30000 * MIB
    assert share.free_bytes == (TOTAL_MIB - 600 - 55000) * MIB  # the driver's reserve is never free
    assert share.shortfall_bytes == (30000 - 24400) * MIB


def test_a_container_not_yet_using_its_gpu_is_owed_its_whole_request():
    [share] = world((B, 45000))
    assert {t.container.pod: t.owed_bytes for t in shares([], [A], GPUS, {UUID_A: GpuMemory(
        UUID_A, TOTAL_MIB * MIB, 0, 0, TOTAL_MIB * MIB)})[0].tenants} == {"a": 40000 * MIB}
    assert share.owed_bytes == 0  # B alone is above its request: nobody is owed anything


def test_no_reclaim_while_every_container_is_within_its_request():
    # requests 40000 + 20000 + 5000 fit in 80000; each uses at most its request
    passes = [world((A, 40000), (B, 20000), (C, 5000))] * 20
    assert run(passes) == []
    passes = [world((A, 1000), (B, 19000), (C, 4000))] * 20
    assert run(passes) == []


def test_no_reclaim_when_free_memory_covers_what_is_owed():
    # B is far above its request, but A's 30000 owed still fit in what is free
    assert run([world((A, 10000), (B, 39000))] * 20) == []


def test_evicts_the_pod_above_its_request_after_the_grace_period():
    contended = world((A, 10000), (B, 45000))
    made = run([contended] * 5)  # passes at 0, 10, 20, 30, 40 s
    assert [t for t, _ in made] == [30.0]  # once held for 30 s; then waits for the eviction to take effect
    [plan] = made[0][1]
    assert [c.pod for c in plan.candidates] == ["b"]
    assert plan.candidates[0].used_bytes == 45000 * MIB and plan.candidates[0].above_request_bytes == 25000 * MIB
    assert [t.container.pod for t in plan.owed] == ["a"] and plan.policy is ReclaimPolicy.EVICT
    assert plan.shortfall_bytes == 5000 * MIB


def test_acts_again_after_another_grace_period_while_the_shortfall_stays():
    made = run([world((A, 10000), (B, 45000))] * 8)  # up to 70 s
    assert [t for t, _ in made] == [30.0, 60.0]


def test_policy_off_reports_each_episode_once():
    contended = world((A, 10000), (B, 45000))
    fits = world((A, 10000), (B, 20000))
    made = run([contended] * 8 + [fits] + [contended] * 5, settings=OFF)
    assert [t for t, _ in made] == [30.0, 120.0]  # once per episode; the second starts at 90 s
    assert all(plan.policy is ReclaimPolicy.OFF for _, plans in made for plan in plans)


def test_usage_hovering_at_the_threshold_does_not_flap():
    # B's usage moves 100 MiB either side of where A's request stops fitting: inside the hysteresis band
    over, under = world((A, 10000), (B, 40100)), world((A, 10000), (B, 39900))
    assert over[0].shortfall_bytes == 100 * MIB and under[0].shortfall_bytes == -100 * MIB
    # short dips above the threshold, each ending well below it, never last the grace period: never acted on
    clear = world((A, 10000), (B, 30000))
    assert run([over, under, clear] * 10) == []
    # hovering within the band keeps one episode, but a shortage broken by a pass that fits is no sustained
    # shortage: spikes 20 s apart never add up to the 30 s window
    assert run([over, under] * 5, settings=OFF) == []
    assert run([over, under] * 5, settings=EVICT) == []
    # held on every pass for the window: acted on once (off), or once per window (evict)
    made = run([over, under] + [over] * 8, settings=OFF)
    assert [t for t, _ in made] == [50.0]  # the window restarts at 20 s, the first over after the dip
    made = run([over, under] + [over] * 8, settings=EVICT)
    assert [t for t, _ in made] == [50.0, 80.0]  # evict: again only after another grace period, still short


def test_two_spikes_thirty_seconds_apart_are_not_a_sustained_shortage():
    spike, fits = world((A, 10000), (B, 45000)), world((A, 10000), (B, 39900))  # fits: within the band
    assert run([spike, fits, fits, spike, fits, fits, spike], step=15.0) == []
    episodes: dict[str, Episode] = {}
    _, episodes = decide(spike, FACTS, episodes, 0.0, EVICT)
    _, episodes = decide(fits, FACTS, episodes, 15.0, EVICT)
    assert episodes == {UUID_A: Episode(since=0.0, short_since=None)}  # the episode goes on, the window not
    plans, episodes = decide(spike, FACTS, episodes, 30.0, EVICT)
    assert plans == [] and episodes[UUID_A].short_since == 30.0


def test_an_episode_ends_only_beyond_the_band():
    over, in_band = world((A, 10000), (B, 40100)), world((A, 10000), (B, 39900))
    episodes: dict[str, Episode] = {}
    _, episodes = decide(over, FACTS, episodes, 0.0, EVICT)
    assert episodes == {UUID_A: Episode(since=0.0, short_since=0.0)}
    _, episodes = decide(in_band, FACTS, episodes, 10.0, EVICT)
    assert episodes == {UUID_A: Episode(since=0.0)}  # 100 MiB to spare is within the 256 MiB band
    _, episodes = decide(world((A, 10000), (B, 39700)), FACTS, episodes, 20.0, EVICT)
    assert episodes == {}  # 300 MiB to spare


def test_candidates_lowest_priority_first_then_youngest():
    b2 = tenant("b2", 4, request_mib=1000, limit_mib=20000)
    [share] = world((A, 1000), (B, 30000), (C, 10000), (b2, 5000))
    facts = {"u-b": PodFacts("b", 0, 2000.0), "u-c": PodFacts("c", 0, 3000.0), "u-b2": PodFacts("b2", 10, 9000.0)}
    assert [c.pod for c in candidates(share, facts)] == ["c", "b", "b2"]  # priority 0 before 10; c is younger
    facts["u-b"] = PodFacts("b", -5, 1.0)
    assert [c.pod for c in candidates(share, facts)] == ["b", "c", "b2"]


def test_only_pods_above_their_request_are_candidates():
    [share] = world((A, 39000), (B, 20000), (C, 6000))
    assert [c.pod for c in candidates(share, FACTS)] == ["c"]


def test_evict_until_the_shortfall_is_covered_skipping_refused_pods():
    [share] = world((A, 1000), (B, 30000), (C, 10000), other_mib=35000)  # 39000 owed, 4000 free: 35000 short
    [(_, [plan])] = run([[share]] * 4)
    assert [c.pod for c in plan.candidates] == ["c", "b"]
    assert [c.pod for c in to_evict(plan)] == ["c", "b"]  # c's 10000 MiB is not enough alone
    [(_, [small])] = run([world((A, 10000), (B, 40000), (C, 20000))] * 4)
    assert small.shortfall_bytes == 20000 * MIB
    assert [c.pod for c in to_evict(small)] == ["c"]  # the youngest covers it alone
    assert [c.pod for c in to_evict(small, refused={"u-c"})] == ["b"]  # a PodDisruptionBudget protects c


def test_a_pod_going_already_is_not_evicted_again():
    going = dict(FACTS, **{"u-c": PodFacts("c", 0, 3000.0, terminating=True)})
    [(_, [plan])] = run([world((A, 10000), (B, 40000), (C, 20000))] * 4, facts=going)
    assert [c.pod for c in plan.candidates] == ["c", "b"] and plan.candidates[0].terminating
    assert to_evict(plan) == []  # c's 20000 MiB, being freed, cover the 20000 short
    [(_, [plan])] = run([world((A, 10000), (B, 50000), (C, 8000))] * 4, facts=going)  # 18000 short
    assert [c.pod for c in to_evict(plan)] == ["b"]


def test_gpus_are_judged_apart():
    a_on_b = tenant("a", 1, request_mib=40000, gpu=UUID_B)
    contended = world((A, 10000), (B, 45000)) + world((a_on_b, 10000), gpu=UUID_B)
    [(_, plans)] = run([contended] * 4)
    assert [p.gpu_uuid for p in plans] == [UUID_A]


@pytest.mark.parametrize("grace", [0.0, 5.0])
def test_a_short_grace_acts_on_the_first_pass_it_allows(grace):
    settings = ReclaimSettings(ReclaimPolicy.EVICT, grace_seconds=grace, hysteresis_bytes=0)
    made = run([world((A, 10000), (B, 45000))] * 2, settings=settings)
    assert made[0][0] == (0.0 if grace == 0 else 10.0)
