"""hack/sbom.py, the image's SBOM: every Python distribution of a virtualenv and every installed Debian package of a
dpkg status file, as SPDX 2.3 packages with package URLs, contained in the image."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STATUS = """Package: libc6
Status: install ok installed
Architecture: amd64
Version: 2.36-9+deb12u9

Package: python3.11-minimal
Status: install ok installed
Architecture: amd64
Version: 3.11.2-6+deb12u6

Package: removed-one
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0
"""


def sbom(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "hack" / "sbom.py"), *args], capture_output=True, text=True,
                          timeout=120)


def test_the_sbom_lists_the_virtualenv_and_the_debian_packages(tmp_path: Path):
    status = tmp_path / "status"
    status.write_text(STATUS)
    out = tmp_path / "sbom.spdx.json"
    site = sysconfig.get_path("purelib")
    done = sbom(tmp_path, "--site-packages", site, "--dpkg-status", str(status), "--version", "0.1.0",
                "--out", str(out))
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["spdxVersion"] == "SPDX-2.3" and doc["name"] == "gpufrac-0.1.0"
    purls = {ref["referenceLocator"] for p in doc["packages"] for ref in p.get("externalRefs", [])}
    assert f"pkg:pypi/flask@{metadata.version('flask')}" in purls
    assert f"pkg:pypi/grpcio@{metadata.version('grpcio')}" in purls
    assert {"pkg:deb/debian/libc6@2.36-9+deb12u9?arch=amd64",
            "pkg:deb/debian/python3.11-minimal@3.11.2-6+deb12u6?arch=amd64"} <= purls
    assert not [p for p in purls if "removed-one" in p]
    (image,) = [p for p in doc["packages"] if p["SPDXID"] == "SPDXRef-image"]
    assert image["licenseDeclared"] == "Apache-2.0"
    contained = {r["relatedSpdxElement"] for r in doc["relationships"] if r["relationshipType"] == "CONTAINS"}
    assert contained == {p["SPDXID"] for p in doc["packages"]} - {"SPDXRef-image"}


def test_a_wrong_directory_is_one_line(tmp_path: Path):
    done = sbom(tmp_path, "--site-packages", str(tmp_path / "none"), "--version", "1", "--out", str(tmp_path / "x"))
    assert done.returncode == 2 and done.stderr.strip().endswith("not a directory") and "Traceback" not in done.stderr
    assert not (tmp_path / "x").exists()


def test_the_dockerfile_writes_it_and_labels_the_image():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "hack/sbom.py" in dockerfile and "/usr/share/doc/gpufrac/sbom.spdx.json" in dockerfile
    for label in ("source", "version", "revision", "licenses"):
        assert f"org.opencontainers.image.{label}=" in dockerfile, label
    assert f"ARG VERSION={metadata.version('gpufrac')}" in dockerfile  # the package's version by default
    assert "@sha256:" in dockerfile.split("ARG BASE=", 1)[1].splitlines()[0]
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    for needed in ("!proto/", "!hack/grpc-stubs.sh", "!hack/sbom.py", "!LICENSE"):
        assert needed in ignored, needed
