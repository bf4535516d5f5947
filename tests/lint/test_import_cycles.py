"""No import circle anywhere in the repo, checked by `make lint`'s two `lint-imports` runs (.importlinter for
gpufrac, .importlinter-tests for the kit, the tests, e2e, bench, gpucheck and the layers between them all): each
test plants a circle into a copy of the repository's packages, runs `lint-imports` there as `make lint` does, and
reads which contract broke; the same copy without the planted modules keeps every one of those contracts."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = ("gpufrac", "gpucheck", "testkit", "tests", "e2e", "bench")
GPUFRAC = ".importlinter"
TEST_SIDE = ".importlinter-tests"
Clean = dict[str, dict[str, str]]  # config -> contract name -> KEPT or BROKEN
RESULT = re.compile(r"^(?P<name>.+) (?P<status>KEPT|BROKEN)(?: \(\d+ ignored imports?\))?$")


def contract_name(config: str, key: str) -> str:
    parser = configparser.ConfigParser()
    parser.read(ROOT / config)
    return parser[f"importlinter:contract:{key}"]["name"]


def copy_repo(copy: Path) -> Path:
    """The Python sources of the repo's packages, the two configurations and the contract type they register."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, copy / package,
                        ignore=lambda d, names: [n for n in names if n == "__pycache__"
                                                 or (not n.endswith(".py") and not (Path(d) / n).is_dir())])
    (copy / "hack").mkdir()
    for name in ("hack/package_cycles.py", GPUFRAC, TEST_SIDE):
        shutil.copy(ROOT / name, copy / name)
    return copy


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return copy_repo(tmp_path / "repo")


def plant(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def lint_imports(root: Path, config: str) -> tuple[int, dict[str, str], str]:
    """`lint-imports` as `make lint` runs it, in `root`: its exit status, each contract's KEPT/BROKEN, its output."""
    env = {**os.environ, "COLUMNS": "1000"}  # one line per contract: the names are long
    args = [str(LINT_IMPORTS), "--no-cache"] + ([config] if config != GPUFRAC else [])
    res = subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=120, env=env)
    output = res.stdout + res.stderr
    results = {m["name"]: m["status"] for m in map(RESULT.match, output.splitlines()) if m}
    assert results, output
    return res.returncode, results, output


def broken(root: Path, config: str) -> tuple[set[str], str]:
    """The contracts this planting broke, that the unplanted copy keeps."""
    status, results, output = lint_imports(root, config)
    assert status == 1, output
    return {name for name, s in results.items() if s == "BROKEN"}, output


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Clean:
    """Each configuration's contracts on a copy as it is (nothing planted)."""
    copy = copy_repo(tmp_path_factory.mktemp("clean") / "repo")
    return {config: lint_imports(copy, config)[1] for config in (GPUFRAC, TEST_SIDE)}


def newly_broken(repo: Path, clean: Clean, config: str) -> tuple[set[str], str]:
    names, output = broken(repo, config)
    return {n for n in names if clean[config][n] == "KEPT"}, output


def test_the_copy_keeps_every_circle_contract(clean: Clean) -> None:
    for config, keys in ((GPUFRAC, ("acyclic", "package-cycles")),
                         (TEST_SIDE, ("root-layers", "acyclic", "package-cycles"))):
        for key in keys:
            assert clean[config][contract_name(config, key)] == "KEPT", (config, key)


def test_a_circle_through_a_function_level_import_deep_in_gpufrac_fails(repo: Path, clean: Clean) -> None:
    plant(repo, {
        "gpufrac/webhook/decide/planted_one.py": """\
            def load():
                from gpufrac.webhook.decide import planted_two
                return planted_two
            """,
        "gpufrac/webhook/decide/planted_two.py": "from gpufrac.webhook.decide.planted_one import load\n",
    })
    names, output = newly_broken(repo, clean, GPUFRAC)
    assert names == {contract_name(GPUFRAC, "acyclic")}
    assert "No cycles are allowed in gpufrac.webhook.decide." in output
    assert ".planted_one" in output and ".planted_two" in output


def test_relative_imports_between_two_subpackages_fail(repo: Path, clean: Clean) -> None:
    plant(repo, {
        "gpufrac/core/planted_a/__init__.py": "",
        "gpufrac/core/planted_a/left.py": "from ..planted_b import right\n",
        "gpufrac/core/planted_b/__init__.py": "",
        "gpufrac/core/planted_b/right.py": "from ..planted_a.left import NAME\n",
    })
    names, output = newly_broken(repo, clean, GPUFRAC)
    assert names == {contract_name(GPUFRAC, "acyclic")}
    assert "No cycles are allowed in gpufrac.core." in output


def test_a_package_init_reexporting_a_module_that_imports_the_package_fails(repo: Path, clean: Clean) -> None:
    plant(repo, {
        "gpufrac/core/planted/__init__.py": "from gpufrac.core.planted.table import RULES\n",
        "gpufrac/core/planted/table.py": "from gpufrac.core.planted import DEFAULTS\n",
    })
    names, output = newly_broken(repo, clean, GPUFRAC)
    assert names == {contract_name(GPUFRAC, "package-cycles")}
    assert "gpufrac.core.planted -> gpufrac.core.planted.table -> gpufrac.core.planted" in output


def test_a_circle_inside_e2e_and_one_through_benchs_package_init_fail(repo: Path, clean: Clean) -> None:
    plant(repo, {
        "e2e/planted_cluster.py": "def load():\n    from e2e.planted_node import NODE\n    return NODE\n",
        "e2e/planted_node.py": "from e2e.planted_cluster import load\n",
        "bench/planted/__init__.py": "from bench.planted.report import render\n",
        "bench/planted/report.py": "from bench import planted\n",
    })
    names, output = newly_broken(repo, clean, TEST_SIDE)
    assert names == {contract_name(TEST_SIDE, "acyclic"), contract_name(TEST_SIDE, "package-cycles")}
    assert "No cycles are allowed in e2e." in output
    assert "bench.planted -> bench.planted.report -> bench.planted" in output


def test_a_circle_between_gpufrac_and_the_kit_fails(repo: Path, clean: Clean) -> None:
    plant(repo, {
        "gpufrac/certs/planted.py": "import testkit.planted\n",
        "testkit/planted.py": "from gpufrac.certs import planted\n",
    })
    names, output = newly_broken(repo, clean, TEST_SIDE)
    assert names == {contract_name(TEST_SIDE, "root-layers")}
    assert "gpufrac.certs.planted -> testkit.planted" in output


def test_one_way_imports_and_a_package_reexporting_its_modules_pass(repo: Path, clean: Clean) -> None:
    plant(repo, {
        "e2e/planted/__init__.py": "from e2e.planted.names import REPO\n",
        "e2e/planted/names.py": "import json\nREPO = 1\n",
        "e2e/planted/cluster.py": "from e2e.planted import REPO\nfrom e2e.planted.names import REPO as SAME\n",
        "bench/planted.py": "def main():\n    from e2e.planted.cluster import REPO\n",
    })
    for config in (GPUFRAC, TEST_SIDE):
        _, results, output = lint_imports(repo, config)
        assert results == clean[config], output
