"""A real-node pod that never runs says why in the timeout (e2e.pods.not_running_reasons): a node under
DiskPressure once showed only as 13 bare timeouts."""

from __future__ import annotations

from pathlib import Path

import yaml

from e2e.pods import not_running_reasons

CASES = list(yaml.safe_load_all((Path(__file__).parent / "data" / "pending-under-disk-pressure.yaml").read_text()))


def test_a_pending_pod_names_the_nodes_pressure_and_taint() -> None:
    said = not_running_reasons(CASES[0]["pod"], CASES[0]["node"])
    assert said.startswith("phase Pending; PodScheduled=False (Unschedulable: 0/1 nodes are available")
    assert "node taint node.kubernetes.io/disk-pressure:NoSchedule" in said
    assert said.endswith("node DiskPressure: kubelet has disk pressure")
    assert "MemoryPressure" not in said and "Ready" not in said  # only what is wrong


def test_a_waiting_container_names_its_reason() -> None:
    said = not_running_reasons(CASES[1]["pod"], CASES[1]["node"])
    assert said == ("phase Pending; Ready=False (ContainersNotReady: containers with unready status: [app]); "
                    "container app waiting: ErrImageNeverPull Container image \"gpufrac-e2e/app:1\" is not present "
                    "with pull policy of Never")
