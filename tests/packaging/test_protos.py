"""The vendored protos (proto/, TEAM convention): upstream path layout, each module's LICENSE beside its files, the
versions in proto/VERSIONS as hack/grpc-stubs.sh pins them; `generate` makes the stubs with no Go on PATH."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "grpc-stubs.sh"


def pinned() -> list[tuple[str, str, list[str]]]:
    block = re.search(r"^MODULES=\(\n(.*?)^\)", SCRIPT.read_text(), re.M | re.S)
    assert block
    rows = [line.strip().strip('"').split() for line in block.group(1).splitlines() if line.strip()]
    return [(module, version, files) for module, version, *files in rows]


def test_every_pinned_module_is_vendored_with_its_license_and_version():
    modules = pinned()
    assert modules, "MODULES is empty"
    versions = dict(line.split() for line in (ROOT / "proto" / "VERSIONS").read_text().splitlines())
    for module, version, files in modules:
        assert versions[module] == version, module
        licenses = sorted((ROOT / "proto" / module).glob("LICENSE*"))  # grpc-gateway's is LICENSE.txt
        assert licenses and re.search(r"Apache License|Redistribution and use", licenses[0].read_text()), module
        for file in files:
            assert (ROOT / "proto" / module / file).is_file(), f"{module}/{file}"


def test_generate_needs_no_go(tmp_path: Path):
    """On a copy of the script and proto/ (the package it writes lands in the copy), with Go off PATH."""
    copy = tmp_path / "repo"
    (copy / "hack").mkdir(parents=True)
    shutil.copy(SCRIPT, copy / "hack" / "grpc-stubs.sh")
    shutil.copytree(ROOT / "proto", copy / "proto")
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                           if d and not (Path(d) / "go").exists())
    done = subprocess.run(["bash", str(copy / "hack" / "grpc-stubs.sh"), "generate"], capture_output=True, text=True,
                          env={**os.environ, "PATH": path, "PYTHON": sys.executable}, timeout=300)
    assert done.returncode == 0, done.stderr
    generated = copy / "gpufrac" / "agent" / "csi" / "generated"
    assert {p.name for p in generated.iterdir()} >= {"__init__.py", "csi_pb2.py", "csi_pb2_grpc.py"}
    assert "github.com/container-storage-interface/spec v1.13.0" in (generated / "__init__.py").read_text()
    registration = copy / "gpufrac" / "agent" / "kubelet_plugin" / "generated"  # once, for CSI and DRA
    assert {p.name for p in registration.iterdir()} >= {"__init__.py", "pluginregistration_pb2.py",
                                                         "pluginregistration_pb2_grpc.py"}
    check = subprocess.run([sys.executable, "-c", "from gpufrac.agent.csi.generated import csi_pb2_grpc; "
                            "from gpufrac.agent.kubelet_plugin.generated import pluginregistration_pb2; "
                            "print(pluginregistration_pb2.PluginInfo.DESCRIPTOR.name)"],
                           cwd=copy, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(copy)})
    assert check.stdout.strip() == "PluginInfo", check.stderr
    # NRI's messages: ttrpc's envelope imports google/rpc/status.proto, generated into the same package
    nri = subprocess.run([sys.executable, "-c", "from gpufrac.agent.nri.generated import api_pb2, request_pb2; "
                          "r = request_pb2.Response(); r.status.code = 9; "
                          "print(r.status.code, api_pb2.CreateContainerResponse.DESCRIPTOR.name)"],
                         cwd=copy, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(copy)})
    assert nri.stdout.strip() == "9 CreateContainerResponse", nri.stderr


def test_vendor_without_go_is_one_line(tmp_path: Path):
    done = subprocess.run(["bash", str(SCRIPT), "vendor"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "Go is needed" in done.stderr
