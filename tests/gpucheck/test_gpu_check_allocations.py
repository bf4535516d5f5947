"""Rows 11a-11d (gpucheck/checks/allocations.py), the rest of escape 10: VMM (cuMemCreate) and pool
(cuMemAllocAsync) allocations against the fakes, the fake libcuda.so.1 counting them through the same path as
cuMemAlloc's; and the same rows where the fake leaves one kind uncounted ($GPUFRAC_FAKE_CUDA_UNCOUNTED, a driver whose
limits miss it), which must FAIL. Rows 11a and 11b need cgroup v2 (the CUDA 13.4 limits): the check runs in a mount
namespace whose /sys/fs/cgroup is the kernel's cgroup v2 hierarchy where the machine allows it, as test_gpu_check's
check 3."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpucheck import cuda as driver
from gpucheck.judge import probe_max_mib
from gpucheck.rows import FAIL, PASS, SKIPPED
from testkit.fakes.build import MPS_CONTROL, fake_cuda_library, fake_nvml_library

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "gpucheck" / "__main__.py"
FAKE_NODE = ROOT / "testkit" / "fakes" / "gpu_check_node.json"
ROWS = ("11a", "11b", "11c", "11d")


def cgroup2_mountable() -> bool:
    return subprocess.run(["unshare", "--mount", "sh", "-c", "mount -t cgroup2 none /sys/fs/cgroup"],
                          capture_output=True, check=False).returncode == 0


CGROUP2 = cgroup2_mountable()


def run_rows(tmp_path: Path, uncounted: str = "") -> dict[str, dict[str, Any]]:
    """`--only 11` against the fakes (in a cgroup v2 mount namespace where the machine allows it)."""
    (tmp_path / "processes").mkdir()
    env = {**os.environ, "GPUFRAC_FAKE_NVML": str(FAKE_NODE),
           "GPUFRAC_FAKE_NVML_SETTINGS": str(tmp_path), "GPUFRAC_FAKE_GPU_PROCESSES": str(tmp_path / "processes"),
           "GPUFRAC_FAKE_CUDA_LOCK": str(tmp_path / "gpu.lock"), "GPUFRAC_FAKE_CUDA_RATE": "2e8"}
    if uncounted:
        env["GPUFRAC_FAKE_CUDA_UNCOUNTED"] = uncounted
    check = (f"exec {sys.executable} {PROGRAM} --nvml {fake_nvml_library()} --cuda {fake_cuda_library()} "
             f"--mps-control {MPS_CONTROL} --workdir {tmp_path / 'work'} --out {tmp_path / 'report.json'} "
             "--spin-seconds 0.5 --only 11")
    command = ["unshare", "--mount", "sh", "-c", f"mount -t cgroup2 none /sys/fs/cgroup && {check}"] if CGROUP2 else [
        "sh", "-c", check]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240, check=False)
    assert (tmp_path / "report.json").is_file(), result.stdout[-3000:] + result.stderr[-3000:]
    rows = {c["id"]: c for c in json.loads((tmp_path / "report.json").read_text())["checks"]}
    assert set(rows) == {"1", "7", *ROWS}, rows  # --only 11 runs both of its places in the order
    failed = any(row["status"] == FAIL for row in rows.values())
    assert result.returncode == (1 if failed else 0), result.stdout[-3000:]
    assert not list((tmp_path / "processes").glob("*.json"))  # every client released its context
    return rows


def got(row: dict[str, Any]) -> list[tuple[str, int, int, str]]:
    return [(c["probe"]["kind"], c["limit_mib"], c["probe"]["allocated_mib"], c["probe"]["stopped_by"])
            for c in row["numbers"]["clients"]]


def test_vmm_and_pool_allocations_are_held_to_the_13_4_limits_and_the_daemons(tmp_path: Path) -> None:
    rows = run_rows(tmp_path)
    if CGROUP2:  # two clients each, each held to its own cgroup's hard limit, allocating the row's way
        assert got(rows["11a"]) == [("vmm", 2048, 2048, "oom"), ("vmm", 4096, 4096, "oom")], rows["11a"]
        assert got(rows["11b"]) == [("pool", 2048, 2048, "oom"), ("pool", 4096, 4096, "oom")], rows["11b"]
        assert rows["11a"]["status"] == rows["11b"]["status"] == PASS
        assert [c["read_back"]["hard"] for c in rows["11a"]["numbers"]["cgroups"]] == [2048 << 20, 4096 << 20]
    else:
        assert rows["11a"]["status"] == rows["11b"]["status"] == SKIPPED
    # one client with no pinned env, held to the limit the sm-sharing daemon was told
    assert got(rows["11c"]) == [("vmm", 2048, 2048, "oom")] and rows["11c"]["status"] == PASS, rows["11c"]
    assert got(rows["11d"]) == [("pool", 2048, 2048, "oom")] and rows["11d"]["status"] == PASS, rows["11d"]
    for row in ("11c", "11d"):
        assert rows[row]["numbers"]["env"] is None
        assert [d["command"] for d in rows[row]["numbers"]["daemon"]] == [
            f"set_default_device_pinned_mem_limit {json.loads(FAKE_NODE.read_text())['gpus'][0]['uuid']} 2048M"]
        assert rows[row]["details"] == ("the daemon at 2048 MiB, no pinned env: 2048/2048 MiB then OUT_OF_MEMORY "
                                        "(cuMemGetInfo total 2048 MiB)")


@pytest.mark.parametrize(("uncounted", "failing"), [("vmm", ("11a", "11c")), ("pool", ("11b", "11d"))])
def test_a_kind_of_allocation_the_limits_do_not_count_fails_its_rows(tmp_path: Path, uncounted: str,
                                                                      failing: tuple[str, ...]) -> None:
    """The control: a driver whose limits miss VMM (or pool) allocations lets the client allocate past its limit,
    and that kind's rows FAIL; the other kind's still PASS."""
    rows = run_rows(tmp_path, uncounted)
    for row_id in ROWS:
        row = rows[row_id]
        if row_id in ("11a", "11b") and not CGROUP2:
            assert row["status"] == SKIPPED
        elif row_id in failing:
            assert row["status"] == FAIL and "not held" in row["details"], row
            assert {(kind, stopped) for kind, _, _, stopped in got(row)} == {(uncounted, "max")}
            assert all(mib == probe_max_mib(limit) // 4 * 4 for _, limit, mib, _ in got(row))
        else:
            assert row["status"] == PASS, row


PROBE_IN_A_CLIENT = """
import ctypes, json, sys
from gpucheck.client.allocations import give_back, probe
from gpucheck.client.main import mem_info
from gpucheck.cuda import Cuda
cuda = Cuda(sys.argv[1])
cuda.check("cuInit", 0)
ctx = ctypes.c_void_p()
cuda.check("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), 0)
cuda.check("cuCtxSetCurrent", ctx)
out = []
for kind in ("alloc", "vmm", "pool"):
    numbers, allocator = probe(cuda, 0, 512, kind)
    held = mem_info(cuda)
    give_back(allocator, numbers["chunks"])
    out.append({"kind": kind, "allocated_mib": numbers["allocated_mib"], "stopped_by": numbers["stopped_by"],
                "chunks": len(numbers["chunks"]), "held": held, "after": mem_info(cuda)})
print(json.dumps(out))
"""


def test_each_probe_allocates_touches_and_gives_back_through_the_drivers_calls() -> None:
    """The client's probes in one process against the fake libcuda.so.1 (a 300 MiB device): each kind allocates up
    to the device (64 MiB chunks, then 4 MiB ones), holds it, and gives all of it back (cuMemFree_v2; cuMemUnmap,
    cuMemRelease, cuMemAddressFree; cuMemFreeAsync), so the next kind starts from an empty device."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_MPS_", "GPUFRAC_FAKE_"))}
    done = subprocess.run([sys.executable, "-c", PROBE_IN_A_CLIENT, str(fake_cuda_library())], cwd=ROOT,
                          env={**env, "GPUFRAC_FAKE_CUDA_TOTAL_MIB": "300"}, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    for result in json.loads(done.stdout):
        assert (result["allocated_mib"], result["stopped_by"], result["chunks"]) == (300, "oom", 4 + 11), result
        assert result["held"] == {"free_mib": 0, "total_mib": 300}
        assert result["after"] == {"free_mib": 300, "total_mib": 300}


def test_the_vmm_structs_have_cuda_hs_layout_on_x86_64() -> None:
    """CUmemAllocationProp_st: type, requestedHandleTypes, location {type, id}, then the pointer at 16 and the 8 bytes
    of allocFlags at 24; CUmemAccessDesc_st: location, flags."""
    prop, access = driver.CUmemAllocationProp, driver.CUmemAccessDesc
    assert ctypes.sizeof(prop) == 32 and ctypes.sizeof(access) == 12
    assert [(field[0], getattr(prop, field[0]).offset) for field in prop._fields_] == [
        ("type", 0), ("requestedHandleTypes", 4), ("location", 8), ("win32HandleMetaData", 16), ("allocFlags", 24)]
    assert ctypes.sizeof(driver.CUmemAllocFlags) == 8 and driver.CUmemAllocFlags.usage.offset == 2
    wanted, rw = driver.device_memory(3)
    assert (wanted.type, wanted.requestedHandleTypes, wanted.location.type, wanted.location.id) == (1, 0, 1, 3)
    assert (rw.location.type, rw.location.id, rw.flags) == (1, 3, 3)
