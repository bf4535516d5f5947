"""Issue 47: the harness runs Kubernetes 1.37.2 (the default) and 1.36.3 side by side. Each version's commands are
cached under their own names (e2e/build-tools.sh writes `kube-apiserver-v<version>`, no shared link), and a run picks
its own by $KUBE_VERSION: two runs of different versions on one machine never swap each other's binaries."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from e2e.toolkit import tools
from e2e.toolkit.errors import ToolsMissingError

REPO = Path(__file__).resolve().parents[2]


def _cache(tmp_path: Path, names: list[str]) -> Path:
    for name in names:
        path = tmp_path / "bin" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    return tmp_path


def test_each_version_finds_its_own_kubernetes_commands_and_shares_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = _cache(tmp_path, ["kube-apiserver-v1.37.2", "kube-apiserver-v1.36.3", "kubelet-v1.36.3", "etcd", "helm"])
    monkeypatch.setenv("GPUFRAC_TOOLS_CACHE", str(cache))
    monkeypatch.delenv("KUBE_VERSION", raising=False)
    assert tools.kube_version() == tools.DEFAULT_KUBE_VERSION == "1.37.2"
    assert tools.find_binary("kube-apiserver") == str(cache / "bin" / "kube-apiserver-v1.37.2")
    assert tools.find_binary("kubelet") is None  # 1.37.2's kubelet is not built here: never 1.36.3's instead
    monkeypatch.setenv("KUBE_VERSION", "1.36.3")
    assert tools.find_binary("kube-apiserver") == str(cache / "bin" / "kube-apiserver-v1.36.3")
    assert tools.find_binary("kubelet") == str(cache / "bin" / "kubelet-v1.36.3")
    assert tools.find_binary("etcd") == str(cache / "bin" / "etcd")  # not a Kubernetes command: one for both


def test_a_version_not_built_is_named_with_the_command_that_builds_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFRAC_TOOLS_CACHE", str(_cache(tmp_path, ["kube-apiserver-v1.37.2", "etcd", "helm"])))
    monkeypatch.setenv("KUBE_VERSION", "1.36.3")
    with pytest.raises(ToolsMissingError) as err:
        tools.Tools.find()
    assert "Kubernetes 1.36.3: kube-apiserver" in str(err.value)
    assert "make tools KUBE_VERSION=1.36.3" in str(err.value)


def test_the_makefile_build_script_and_harness_agree_on_the_versions() -> None:
    makefile = (REPO / "Makefile").read_text()
    script = (REPO / "e2e" / "build-tools.sh").read_text()
    assert re.search(r"^KUBE_VERSION \?= (\S+)$", makefile, re.M)[1] == tools.DEFAULT_KUBE_VERSION  # type: ignore[index]
    assert "export KUBE_VERSION" in makefile
    assert f"KUBE_VERSION=${{KUBE_VERSION:-{tools.DEFAULT_KUBE_VERSION}}}" in script
    # No unversioned link to a Kubernetes command: the harness would follow whichever version was built last.
    assert not re.search(r'ln -sf "\$c-v\$KUBE_VERSION"|ln -sf "kube-apiserver-v', script)
    ci = (REPO / ".ci" / "run").read_text()
    others = [v for v in tools.TESTED_KUBE_VERSIONS if v != tools.DEFAULT_KUBE_VERSION]
    assert others and all(f"make test-api KUBE_VERSION={v}" in ci for v in others)
    assert os.environ.get("KUBE_VERSION", tools.DEFAULT_KUBE_VERSION) in tools.TESTED_KUBE_VERSIONS


def test_the_controller_manager_is_told_only_controllers_its_version_knows() -> None:
    from e2e.toolkit.controllers import disabled_controllers

    # 1.37's kube-controller-manager exits on a name it does not know (the cloud controllers were removed).
    assert disabled_controllers("1.37.2") == ("nodeipam",)
    assert set(disabled_controllers("1.36.3")) == {"nodeipam", "cloud-node-lifecycle", "service-lb-controller"}
