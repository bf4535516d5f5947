"""The agent's part of the uninstall (host_withdraw): the release's host paths go when its DaemonSet is gone, and
stay through a rolling update (the DaemonSet in place) or while the API cannot say."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufrac.agent.programs.host_withdraw import remove_host_paths, withdraw_from_host

PATHS = ["/run/gpufrac/nri", "/run/gpufrac/mps", "/var/lib/gpufrac/dra", "/var/run/cdi/gpu.gpufrac.io-claim_*.json"]


class Api:
    def __init__(self, present: bool | Exception) -> None:
        self.present = present

    def daemonset_present(self, namespace: str, name: str) -> bool:
        if isinstance(self.present, Exception):
            raise self.present
        return self.present


def host(tmp_path: Path) -> Path:
    """A host with what the agent leaves, and what others own beside it."""
    root = tmp_path / "host"
    for d in ("run/gpufrac/nri", "run/gpufrac/mps/time-slicing", "run/gpufrac/mps/shm", "var/lib/gpufrac/dra",
              "var/run/cdi", "run/containerd"):
        (root / d).mkdir(parents=True)
    (root / "run/gpufrac/nri/plugin.lock").write_text("")
    (root / "var/lib/gpufrac/dra/prepared.json").write_text("{}")
    (root / "var/run/cdi/gpu.gpufrac.io-claim_u1.json").write_text("{}")
    (root / "var/run/cdi/nvidia.yaml").write_text("")  # NVIDIA's spec: not gpufrac's
    return root


def test_gone_daemonset_the_host_paths_and_the_empty_gpufrac_directories_go(tmp_path: Path) -> None:
    root = host(tmp_path)
    removed = withdraw_from_host(Api(False), "gpufrac-system", "gpufrac-agent", PATHS, root)
    assert removed is not None and "/run/gpufrac" in removed and "/var/lib/gpufrac" in removed
    assert not (root / "run/gpufrac").exists() and not (root / "var/lib/gpufrac").exists()
    assert sorted(p.name for p in (root / "var/run/cdi").iterdir()) == ["nvidia.yaml"]
    assert (root / "run/containerd").is_dir()


@pytest.mark.parametrize("present", [True, RuntimeError("connection refused")])
def test_a_rolling_update_or_an_unreachable_api_removes_nothing(tmp_path: Path, present: bool | Exception) -> None:
    root = host(tmp_path)
    assert withdraw_from_host(Api(present), "gpufrac-system", "gpufrac-agent", PATHS, root) is None
    assert (root / "run/gpufrac/nri/plugin.lock").exists() and (root / "var/lib/gpufrac/dra/prepared.json").exists()


def test_a_gpufrac_directory_another_file_still_holds_stays(tmp_path: Path) -> None:
    root = host(tmp_path)
    (root / "run/gpufrac/other").write_text("")
    remove_host_paths(PATHS, root)
    assert sorted(p.name for p in (root / "run/gpufrac").iterdir()) == ["other"]
