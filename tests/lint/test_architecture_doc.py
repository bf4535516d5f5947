"""docs/architecture.md against the code (issue 46): the agent's map in "Inside the agent" names every module of the
agent and nothing else, and every `agent.…` name the document writes resolves to a module (or one of its names)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
AGENT = ROOT / "gpufrac" / "agent"
SKIPPED = {"generated", "__pycache__"}  # the gRPC stubs, generated at build time


def agent_packages(root: Path = AGENT) -> dict[str, set[str]]:
    """Every package of the agent (dotted, from gpufrac.agent) -> its modules (not its subpackages)."""
    packages = {}
    for init in sorted(root.rglob("__init__.py")):
        folder = init.parent
        if SKIPPED & set(folder.relative_to(root.parent.parent).parts):
            continue
        modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
        if modules:  # gpufrac.agent itself holds packages only
            packages[".".join(folder.relative_to(root.parent.parent).parts)] = modules
    return packages


def _without_parentheses(text: str) -> str:
    while True:
        stripped = re.sub(r"\([^()]*\)", "", text)
        if stripped == text:
            return stripped
        text = stripped


def agent_map(doc: str) -> dict[str, set[str]]:
    """The code block of "### Inside the agent": package -> the modules it names."""
    section = doc.split("### Inside the agent", 1)[1]
    block = section.split("```", 2)[1]
    named: dict[str, str] = {}
    package = None
    for line in block.splitlines():
        start = re.match(r"(gpufrac\.agent[a-z_.]*)\s+(.*)", line)
        if start:
            package = start.group(1)
            named[package] = start.group(2)
        elif package is not None and re.match(r"\s{20,}\S", line):
            named[package] += " " + line.strip()
        else:
            package = None  # a heading between the packages
    return {package: {name.strip().strip("`").removeprefix("pure:").strip()
                      for name in _without_parentheses(text).split(",") if name.strip()}
            for package, text in named.items()}


def map_problems(doc: str, packages: dict[str, set[str]]) -> list[str]:
    found = agent_map(doc)
    problems = [f"{package} is not in the map" for package in packages if package not in found]
    for package, names in found.items():
        if package not in packages:
            problems.append(f"the map names package {package}, which does not exist")
            continue
        problems += [f"the map names {package}.{n}, which does not exist" for n in sorted(names - packages[package])]
        problems += [f"{package}.{n} is named nowhere in the map" for n in sorted(packages[package] - names)]
    return problems


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def name_problems(doc: str) -> list[str]:
    """Every `agent.…` or `gpufrac.agent.…` in backticks, and every gpufrac/agent/… path."""
    dotted = set(re.findall(r"`(?:gpufrac\.)?(agent(?:\.[A-Za-z_]+)+)", doc))
    paths = set(re.findall(r"`(gpufrac/agent/[a-z_/]+(?:\.py)?)`?", doc))
    return [f"`{name}` names no module or name of the code" for name in sorted(dotted)
            if not _resolves(f"gpufrac.{name}")] + \
        [f"`{path}` does not exist" for path in sorted(paths) if not (ROOT / path).exists()]


def test_the_map_names_every_module_of_the_agent_and_nothing_else() -> None:
    assert map_problems(DOC.read_text(), agent_packages()) == []


def test_every_agent_name_the_document_writes_exists() -> None:
    assert name_problems(DOC.read_text()) == []


def test_the_checks_find_a_module_left_out_a_module_made_up_and_a_stale_name() -> None:
    doc = DOC.read_text()
    packages = agent_packages()
    without = doc.replace("sweep (fractions created while the\n", "(fractions created while the\n", 1)
    assert without != doc
    assert map_problems(without, packages) == ["gpufrac.agent.nri.decide.sweep is named nowhere in the map"]
    made_up = doc.replace("config, stubs\n", "config, stubs, tunnel\n", 1)
    assert map_problems(made_up, packages) == ["the map names gpufrac.agent.nri.tunnel, which does not exist"]
    grown = {**packages, "gpufrac.agent.nri": packages["gpufrac.agent.nri"] | {"watcher"}}
    assert map_problems(doc, grown) == ["gpufrac.agent.nri.watcher is named nowhere in the map"]
    stale = doc + "\nThe old `agent.decide.nri_decision.decide` and `gpufrac/agent/edges/nri/devices.py`.\n"
    assert name_problems(stale) == ["`agent.decide.nri_decision.decide` names no module or name of the code",
                                    "`gpufrac/agent/edges/nri/devices.py` does not exist"]
