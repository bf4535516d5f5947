"""Row 10 (gpucheck/checks/dra.py) against the fakes: a client with an sm-sharing DRA claim's env, on the fake
sm-sharing daemon told the claim's limits, held to the claim's limit by the fake libcuda.so.1; and the same row with
the claim's limit not applied (the check run with its builders patched), which must FAIL. test_contract.py asserts
that the env and the daemon commands are what gpufrac's DRA driver and agent give the same claim."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpucheck import contract as restated
from gpucheck.checks.dra import CLAIM_COMPUTE, quarter_claim
from gpucheck.judge import probe_max_mib
from gpucheck.rows import FAIL, PASS
from gpucheck.run import check_of
from testkit.fakes.build import MPS_CONTROL, fake_cuda_library, fake_nvml_library

ROOT = Path(__file__).resolve().parents[2]
FAKE_NODE = ROOT / "testkit" / "fakes" / "gpu_check_node.json"
FAKE_GPU = json.loads(FAKE_NODE.read_text())["gpus"][0]

# The check as `python3 gpucheck/__main__.py` runs it, its builders patched first: the claim's env without its pinned
# limit (`env`), the daemon told nothing (`daemon`). Its clients start unpatched, from gpucheck/__main__.py.
PATCHED = """
import sys
from gpucheck import contract
from gpucheck.checks import dra, escapes
drop = set(sys.argv[1].split(","))
if "env" in drop:
    build = dra.claim_env
    dra.claim_env = lambda *claim: {k: v for k, v in build(*claim).items() if k != contract.ENV_PINNED_MEM_LIMIT}
if "daemon" in drop:
    escapes.DaemonSideLimits.tell = lambda self, pinned_mib, thread_percent=None: []
from gpucheck.cli import main
sys.exit(main(sys.argv[2:]))
"""


def run_row(tmp_path: Path, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    (tmp_path / "processes").mkdir()
    env = {**os.environ, "GPUFRAC_FAKE_NVML": str(FAKE_NODE),
           "GPUFRAC_FAKE_NVML_SETTINGS": str(tmp_path), "GPUFRAC_FAKE_GPU_PROCESSES": str(tmp_path / "processes"),
           "GPUFRAC_FAKE_CUDA_LOCK": str(tmp_path / "gpu.lock"), "GPUFRAC_FAKE_CUDA_RATE": "2e8"}
    command = [sys.executable, str(ROOT / "gpucheck" / "__main__.py")]
    if drop:
        command = [sys.executable, "-c", PATCHED, ",".join(drop)]
    result = subprocess.run([*command, "--only", "10", "--spin-seconds", "0.5", "--nvml", str(fake_nvml_library()),
                             "--mps-control", str(MPS_CONTROL), "--cuda", str(fake_cuda_library()), "--workdir",
                             str(tmp_path / "work"), "--out", str(tmp_path / "report.json")],
                            capture_output=True, text=True, env=env, timeout=240, check=False, cwd=ROOT)
    assert (tmp_path / "report.json").is_file(), result.stdout[-3000:] + result.stderr[-3000:]
    rows = {c["id"]: c for c in json.loads((tmp_path / "report.json").read_text())["checks"]}
    assert set(rows) == {"1", "7", "10"}, rows
    assert result.returncode == (0 if rows["10"]["status"] == PASS else 1), result.stdout[-3000:]
    assert not list((tmp_path / "processes").glob("*.json"))  # the client released its context
    return rows["10"]


def told(tmp_path: Path) -> list[str]:
    path = tmp_path / "work" / "log" / restated.SM_SHARING / "fake-mps-record.jsonl"
    return [e["command"] for e in map(json.loads, path.read_text().splitlines()) if e.get("event") == "limit"]


def test_a_claims_client_is_held_to_the_claims_limit(tmp_path: Path) -> None:
    row = run_row(tmp_path)
    assert row["status"] == PASS, row
    claim = quarter_claim(FAKE_GPU["memory_total_mib"])
    assert (claim.request_mib, claim.limit_mib, claim.compute_percent) == (35942, 35942, CLAIM_COMPUTE)
    uuid, pipe = FAKE_GPU["uuid"], str(tmp_path / "work" / "mps" / restated.SM_SHARING)
    assert row["numbers"]["env"] == restated.claim_env(uuid, pipe, 35942, 35942, CLAIM_COMPUTE)
    assert told(tmp_path)[:2] == [f"set_default_device_pinned_mem_limit {uuid} 35942M",
                                  f"set_default_active_thread_percentage {CLAIM_COMPUTE}"]
    [client] = row["numbers"]["clients"]
    # below the limit every allocation succeeded (4 MiB chunks: 35940 MiB), the next one, past it, was refused
    assert (client["limit_mib"], client["probe"]["allocated_mib"], client["probe"]["stopped_by"]) == (
        35942, 35940, "oom")
    assert client["mem_after"]["total_mib"] == 35942
    assert row["details"].startswith("claim 35942 MiB, limit 35942 MiB, 25% threads (GPU 143771 MiB)")
    assert "35940/35942 MiB then OUT_OF_MEMORY" in row["details"]


@pytest.mark.parametrize(("drop", "status"), [(("env", "daemon"), FAIL), (("env",), PASS), (("daemon",), PASS)])
def test_a_claim_whose_limit_is_not_applied_fails(tmp_path: Path, drop: tuple[str, ...], status: str) -> None:
    """Neither the env's pinned limit nor the daemon's: the client allocates past the claim's limit, and the row
    FAILs. Either alone holds it (the daemon side for a client that dropped its env, the UUID-keyed env where the
    daemon was not told)."""
    row = run_row(tmp_path, drop)
    assert row["status"] == status, row
    [client] = row["numbers"]["clients"]
    if status == FAIL:
        assert "not held" in row["details"]
        assert restated.ENV_PINNED_MEM_LIMIT not in row["numbers"]["env"] and row["numbers"]["daemon"] == []
        assert (client["probe"]["stopped_by"], client["probe"]["allocated_mib"]) == (
            "max", probe_max_mib(35942) // 4 * 4)
    else:
        assert client["probe"]["allocated_mib"] == 35940


def test_only_names_row_10_by_its_whole_number() -> None:
    assert [check_of(row) for row in ("1", "1c", "9a", "10", "10b")] == ["1", "1", "9", "10", "10"]
