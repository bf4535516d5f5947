"""Issue 31: the agent's own admission of requests. A fraction whose request does not fit in its GPU's usable memory
next to the requests already owed there is refused at creation, with the numbers (gpufrac.agent.decide.request_fit,
the NRI plugin's GPURequestDoesNotFit)."""

from __future__ import annotations

from gpufrac.agent.decide.request_fit import Owed, does_not_fit, owed_by_gpu
from testkit.agent import UUID_A, UUID_B, container, gpu_info

GPUS = (gpu_info(0, UUID_A), gpu_info(1, UUID_B))


def test_the_requests_placed_on_each_gpu_by_uuid_or_index():
    unbound = container("app", pod="portion", uid="u-portion", request_mib=None, limit_mib=None, devices=(UUID_A,))
    placed = [unbound,  # a portion pod before its bind: no request yet
              container("app", pod="a", uid="u-a", request_mib=30000, limit_mib=40000, devices=(UUID_A,)),
              container("app", pod="b", uid="u-b", request_mib=20000, limit_mib=20000, devices=("1",)),  # by index
              container("two", pod="c", uid="u-c", request_mib=5000, limit_mib=5000, devices=(UUID_A, UUID_B)),
              container("app", pod="gone", uid="u-gone", request_mib=5000, limit_mib=5000, devices=("GPU-unknown",))]
    c = Owed("u-c", "two", "team-a/c", 5000)
    assert owed_by_gpu(placed, GPUS) == {UUID_A: (Owed("u-a", "app", "team-a/a", 30000), c),
                                         UUID_B: (Owed("u-b", "app", "team-a/b", 20000), c)}


def test_a_request_that_does_not_fit_next_to_the_others_is_said_with_the_numbers():
    owed = {UUID_A: (Owed("u-a", "app", "team-a/a", 30000), Owed("u-new", "app", "team-a/new", 50000))}
    usable = {UUID_A: 79000}
    assert does_not_fit("u-new", "app", 49000, (UUID_A,), usable, owed) is None  # its own entry is not counted
    assert does_not_fit("u-new", "app", 50000, (UUID_A,), usable, owed) == (
        f"its request of 50000 MiB does not fit on GPU {UUID_A}: 79000 MiB usable there, 30000 MiB of it requested "
        "by the fractions placed there (team-a/a (app) 30000 MiB)")
    assert does_not_fit("u-new", "side", 49001, (UUID_A,), usable, owed) is not None  # a sibling container counts
    assert does_not_fit("u-new", "app", 80000, (UUID_B,), usable, owed) is None  # not measured yet: no refusal
    assert does_not_fit("u-new", "app", 50000, (UUID_B, UUID_A), usable, owed) is not None  # the next GPU still counts
    two = {UUID_A: (Owed("u-a", "app", "team-a/a", 30000), Owed("u-b", "app", "team-a/b", 20000))}
    assert does_not_fit("u-new", "app", 30000, (UUID_A,), usable, two) == (
        f"its request of 30000 MiB does not fit on GPU {UUID_A}: 79000 MiB usable there, 50000 MiB of it requested "
        "by the fractions placed there (team-a/a (app) 30000 MiB, team-a/b (app) 20000 MiB)")
    assert does_not_fit("u-new", "app", None, (UUID_A,), usable, owed) is None
    assert "(none)" in (does_not_fit("u-x", "app", 80000, (UUID_A,), usable, {}) or "")
