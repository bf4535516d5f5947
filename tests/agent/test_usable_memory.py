"""The MPS servers' context as remembered for usable memory: a maximum that decays (gpufrac.agent.decide.capacity)."""

from __future__ import annotations

from gpufrac.agent.decide.capacity import Remembered, remember_contexts
from gpufrac.agent.edges.procfs import read_parent_pid
from gpufrac.core.contract import MIB
from testkit.fakes.state import ProcRoot

KEEP = 3600.0


def test_the_largest_context_is_kept_while_servers_come_and_go():
    seen = remember_contexts({}, {"A": 300 * MIB}, 0.0, KEEP)
    assert seen == {"A": Remembered(300 * MIB, 0.0)}
    seen = remember_contexts(seen, {}, 100.0, KEEP)  # no server now (no client): the figure stays
    assert seen == {"A": Remembered(300 * MIB, 0.0)}
    seen = remember_contexts(seen, {"A": 100 * MIB}, 200.0, KEEP)  # a smaller reading, within the hour: kept
    assert seen == {"A": Remembered(300 * MIB, 0.0)}
    seen = remember_contexts(seen, {"A": 300 * MIB}, 3000.0, KEEP)  # confirmed again: the hour restarts
    assert seen == {"A": Remembered(300 * MIB, 3000.0)}


def test_the_keep_period_counts_from_the_last_confirmation():
    seen = {"A": Remembered(900 * MIB, 5000.0)}
    assert remember_contexts(seen, {"A": 100 * MIB}, 5100.0, KEEP) == seen
    assert remember_contexts(seen, {"A": 100 * MIB}, 5000.0 + KEEP, KEEP) == {"A": Remembered(100 * MIB, 8600.0)}


def test_the_maximum_decays_once_unconfirmed_for_the_keep_period():
    seen = {"A": Remembered(900 * MIB, 0.0), "B": Remembered(300 * MIB, 0.0)}
    seen = remember_contexts(seen, {"A": 250 * MIB}, KEEP, KEEP)
    assert seen == {"A": Remembered(250 * MIB, KEEP), "B": Remembered(300 * MIB, 0.0)}
    assert remember_contexts(seen, {"A": 400 * MIB}, KEEP + 1, KEEP)["A"] == Remembered(400 * MIB, KEEP + 1)


def test_a_process_parent_is_read_from_stat_whatever_its_name(tmp_path):
    proc = ProcRoot(tmp_path)
    proc.add_program(77, ["nvidia-cuda-mps-server"])
    (tmp_path / "77" / "stat").write_text("77 (a) b) (c) S 12 77 " + "0 " * 18 + "\n")  # a name with ") S 1 "
    assert read_parent_pid(tmp_path, 77) == 12


def test_mps_contexts_sum_the_servers_on_each_gpu_only():
    from gpufrac.agent.decide.capacity import mps_contexts
    from gpufrac.agent.decide.model import GpuProcess

    processes = [GpuProcess("A", 10, 300 * MIB, None), GpuProcess("A", 11, 200 * MIB, None),
                 GpuProcess("B", 10, None, None), GpuProcess("B", 12, 5000 * MIB, None)]
    assert mps_contexts(processes, [10, 11]) == {"A": 500 * MIB, "B": 0}


def test_usable_takes_the_reserve_and_the_context_off_each_gpu_read():
    from gpufrac.agent.decide.capacity import usable
    from gpufrac.agent.decide.model import GpuMemory
    from testkit.agent import gpu_info

    a, b, c = gpu_info(0, "A", 80000), gpu_info(1, "B", 80000), gpu_info(2, "C", 80000)
    memory = {"A": GpuMemory("A", 80000 * MIB, 600 * MIB, 0, 0), "B": GpuMemory("B", 1000 * MIB, 600 * MIB, 0, 0)}
    found = usable([c, a, b], memory, {"B": 500 * MIB})  # C: no reading
    assert [(u.gpu.uuid, u.total_bytes, u.reserved_bytes, u.mps_context_bytes) for u in found] == [
        ("A", 80000 * MIB, 600 * MIB, 0), ("B", 1000 * MIB, 600 * MIB, 500 * MIB)]
    assert [u.usable_bytes for u in found] == [79400 * MIB, 0]  # never below zero


def test_the_newest_process_by_start_time_then_pid():
    from gpufrac.agent.decide.overlimit import newest

    assert newest([5, 6, 7], {5: 100, 6: 300, 7: 200}) == 6
    assert newest([5, 6, 7], {5: 300, 6: 300}) == 6  # a tie: the later PID; 7 exited (no start time)
    assert newest([9, 8], {8: 1, 9: 1}) == 9
    assert newest([5], {}) is None
    assert newest([], {1: 1}) is None


def test_usable_labels_per_model():
    from gpufrac.agent.decide.capacity import Usable, model_slug, usable_labels
    from testkit.agent import gpu_info

    assert model_slug("NVIDIA H200") == "NVIDIA-H200"
    assert model_slug("NVIDIA A100-SXM4-80GB") == "NVIDIA-A100-SXM4-80GB"
    assert model_slug(" (weird) name/with:chars ") == "weird-name-with-chars"
    assert model_slug("") == "unknown"
    long = model_slug("X" * 100)
    assert len("gpu-memory-usable-mib." + long) == 63  # a label name's limit
    h200 = [Usable(gpu_info(i, f"GPU-{i}"), 80000 * MIB, r * MIB, c * MIB) for i, (r, c) in enumerate([(600, 0),
                                                                                                        (500, 200)])]
    assert [u.usable_bytes for u in h200] == [79400 * MIB, 79300 * MIB]
    assert usable_labels(h200) == {"gpufrac.io/gpu-memory-usable-mib.NVIDIA-H200": "79300"}
    assert usable_labels(list(reversed(h200))) == {"gpufrac.io/gpu-memory-usable-mib.NVIDIA-H200": "79300"}
    room = 63 - len("gpu-memory-usable-mib.")
    assert model_slug("A" * (room - 1) + " B") == "A" * (room - 1)  # cut where a dash would end it
