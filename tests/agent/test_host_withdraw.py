"""The agent's part of the uninstall (host_withdraw): the release's host paths go when its DaemonSet is gone, and
stay through a rolling update (the DaemonSet in place) or while the API cannot say."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufrac.agent.programs.host_withdraw import host_root, remove_host_paths, withdraw_from_host

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


def test_the_host_s_root_is_the_nearest_ancestor_in_another_mount_namespace(tmp_path: Path) -> None:
    """A fake /proc: the agent (pid 40) and its wrapper (30) in the container's mount namespace, the runtime's shim
    (20) in the host's; pid 1 refuses to be read (as on a sandboxed host)."""
    proc = tmp_path / "proc"
    for pid, parent, ns in ((40, 30, "mnt:[2]"), (30, 20, "mnt:[2]"), (20, 1, "mnt:[1]")):
        (proc / str(pid) / "ns").mkdir(parents=True)
        (proc / str(pid) / "status").write_text(f"Name:\tx\nPPid:\t{parent}\n")
        (proc / str(pid) / "ns" / "mnt").symlink_to(ns)
    (proc / "self").symlink_to(proc / "40")
    assert host_root(proc, 40) == proc / "20" / "root"
    (proc / "20" / "ns" / "mnt").unlink()
    (proc / "20" / "ns" / "mnt").symlink_to("mnt:[2]")  # nothing in another namespace: pid 1's root
    assert host_root(proc, 40) == proc / "1" / "root"
