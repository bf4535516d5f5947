"""constraints.txt pins what the tests ran with: the image (Dockerfile) and the virtualenv install with -c it, so
a dependency it misses would reach the image in whatever version the index has that day."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
# What `pip freeze` (and so `make constraints`) leaves out: the installer's own tools.
INSTALLER_TOOLS = {"pip", "setuptools", "wheel"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    lines = (REPO / "constraints.txt").read_text().splitlines()
    return {canonical(name): version for name, version in
            (line.split("==", 1) for line in lines if line and not line.startswith("#"))}


def closure(root: str, extras: tuple[str, ...]) -> set[str]:
    """Every distribution that installing `root[extras]` brings, as installed here."""
    seen: set[str] = set()
    todo = [(root, extras)]
    while todo:
        name, wanted = todo.pop()
        for text in metadata.requires(name) or ():
            req = Requirement(text)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in (*wanted, "")):
                continue
            dep = canonical(req.name)
            if dep not in seen:
                seen.add(dep)
                todo.append((dep, tuple(req.extras)))
    return seen


def test_every_dependency_of_the_package_and_its_test_tools_is_pinned_at_the_installed_version():
    pinned = pins()
    needed = closure("gpufrac", ("test", "build")) - INSTALLER_TOOLS
    assert {"flask", "gunicorn", "grpcio", "grpcio-tools", "protobuf", "pytest"} <= needed
    unpinned = sorted(needed - pinned.keys())
    assert not unpinned, f"constraints.txt lacks {unpinned}: run `make constraints` from a venv that passed"
    drift = {name: (pinned[name], metadata.version(name)) for name in needed
             if metadata.version(name) != pinned[name]}
    assert not drift, f"installed versions differ from constraints.txt (pinned, installed): {drift}"
