"""The image's software bill of materials (SPDX 2.3 JSON), written by the Dockerfile's build stage from what is
installed: the Python distributions of gpufrac's virtualenv and the Debian packages of the base image.

    python3 hack/sbom.py --site-packages DIR [--dpkg-status FILE] --version V --out FILE

Standard library only: it runs with the base image's python3, outside the virtualenv it describes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import uuid
from importlib import metadata
from pathlib import Path

IMAGE = "gpufrac"


def python_packages(site_packages: Path) -> list[dict[str, str]]:
    found = {}
    for dist in metadata.distributions(path=[str(site_packages)]):
        name = dist.metadata["Name"]
        if not name:
            continue
        licence = dist.metadata.get("License-Expression") or ""
        found[name.lower()] = {"name": name, "version": dist.version, "license": licence,
                               "purl": f"pkg:pypi/{normalized(name)}@{dist.version}"}
    return [found[k] for k in sorted(found)]


def normalized(name: str) -> str:
    """A PyPI name as package URLs write it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def debian_packages(status: Path) -> list[dict[str, str]]:
    """The installed packages of a dpkg status file (`Status: install ok installed`)."""
    packages = []
    for stanza in status.read_text(errors="replace").split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): ?(.*)$", stanza, re.M))
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            arch = fields.get("Architecture", "all")
            packages.append({"name": fields["Package"], "version": fields.get("Version", ""), "license": "",
                             "purl": f"pkg:deb/debian/{fields['Package']}@{fields.get('Version', '')}?arch={arch}"})
    return sorted(packages, key=lambda p: p["name"])


def spdx_id(kind: str, name: str, version: str) -> str:
    return "SPDXRef-" + re.sub(r"[^A-Za-z0-9.-]+", "-", f"{kind}-{name}-{version}")


def document(version: str, packages: list[tuple[str, dict[str, str]]]) -> dict[str, object]:
    created = datetime.datetime.fromtimestamp(int(os.environ.get("SOURCE_DATE_EPOCH", "0")) or
                                              datetime.datetime.now(datetime.UTC).timestamp(), datetime.UTC)
    root = "SPDXRef-image"
    spdx_packages: list[dict[str, object]] = [{
        "name": IMAGE, "SPDXID": root, "versionInfo": version, "downloadLocation": "NOASSERTION",
        "licenseConcluded": "Apache-2.0", "licenseDeclared": "Apache-2.0", "primaryPackagePurpose": "CONTAINER"}]
    relationships = [{"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES",
                      "relatedSpdxElement": root}]
    for kind, pkg in packages:
        ident = spdx_id(kind, pkg["name"], pkg["version"])
        spdx_packages.append({
            "name": pkg["name"], "SPDXID": ident, "versionInfo": pkg["version"], "downloadLocation": "NOASSERTION",
            "licenseConcluded": "NOASSERTION", "licenseDeclared": pkg["license"] or "NOASSERTION",
            "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                              "referenceLocator": pkg["purl"]}]})
        relationships.append({"spdxElementId": root, "relationshipType": "CONTAINS", "relatedSpdxElement": ident})
    return {
        "spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0", "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{IMAGE}-{version}", "documentNamespace": f"https://spdx.org/spdxdocs/{IMAGE}-{version}-{uuid.uuid4()}",
        "creationInfo": {"created": created.strftime("%Y-%m-%dT%H:%M:%SZ"), "creators": ["Tool: gpufrac-hack-sbom"]},
        "packages": spdx_packages, "relationships": relationships,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site-packages", type=Path, required=True)
    parser.add_argument("--dpkg-status", type=Path, default=Path("/var/lib/dpkg/status"))
    parser.add_argument("--version", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not args.site_packages.is_dir():
        print(f"sbom: {args.site_packages}: not a directory", file=sys.stderr)
        return 2
    python = python_packages(args.site_packages)
    debian = debian_packages(args.dpkg_status) if args.dpkg_status.is_file() else []
    if not python:
        print(f"sbom: {args.site_packages}: no Python distributions", file=sys.stderr)
        return 2
    packages = [("python", p) for p in python] + [("deb", p) for p in debian]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document(args.version, packages), indent=1) + "\n")
    print(f"sbom: {args.out}: {len(python)} Python distributions, {len(debian)} Debian packages", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
