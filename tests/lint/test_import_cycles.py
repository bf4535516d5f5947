"""hack/import_cycles.py, `make lint`'s check that no import circle exists anywhere in the repo: it finds circles
through module-level and function-level imports, relative imports and `from pkg import module`, prints one line
per circle, fails on them, and passes on the repository itself."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "import_cycles.py"


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True, timeout=60)


def test_a_circle_through_a_function_level_import_fails_with_one_line(tmp_path):
    root = write(tmp_path, {
        "e2e/__init__.py": "",
        "e2e/cluster.py": "def load():\n    from e2e.node import RealCluster\n    return RealCluster\n",
        "e2e/node.py": "from e2e.cluster import load\n",
    })
    res = check(root)
    assert res.returncode == 1
    assert res.stdout.splitlines() == ["import cycle: e2e.cluster -> e2e.node -> e2e.cluster"]


def test_relative_imports_and_from_package_import_module_are_followed_across_packages(tmp_path):
    root = write(tmp_path, {
        "gpufrac/__init__.py": "",
        "gpufrac/certs/__init__.py": "",
        "gpufrac/certs/kube.py": "from . import rotation\n",
        "gpufrac/certs/rotation.py": "import tests.helpers\n",
        "tests/__init__.py": "",
        "tests/helpers.py": "from gpufrac.certs.kube import x\n",
    })
    res = check(root)
    assert res.returncode == 1
    assert res.stdout.splitlines() == [
        "import cycle: gpufrac.certs.kube -> gpufrac.certs.rotation -> tests.helpers -> gpufrac.certs.kube"]


def test_a_package_reexporting_its_submodules_and_one_way_imports_pass(tmp_path):
    root = write(tmp_path, {
        "e2e/__init__.py": "from e2e.cluster import ControlPlane\n",
        "e2e/cluster.py": "import json\nfrom e2e import names\n",
        "e2e/names.py": "REPO = 1\n",
        "e2e/node.py": "from e2e.cluster import ControlPlane\nfrom e2e.names import REPO\n",
        "bench/__init__.py": "",
        "bench/run.py": "def main():\n    from e2e.node import ControlPlane\n",
    })
    res = check(root)
    assert res.returncode == 0, res.stdout
    assert "no import cycle in 6 modules" in res.stdout


def test_taking_a_name_from_a_package_init_is_an_edge_to_the_package(tmp_path):
    root = write(tmp_path, {
        "bench/__init__.py": "from bench.report import render\n",
        "bench/report.py": "from bench import DEFAULTS\n",
    })
    res = check(root)
    assert res.stdout.splitlines() == ["import cycle: bench -> bench.report -> bench"]


def test_the_repository_has_no_import_circle():
    res = check(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
