"""An import-linter contract type for the one import circle that `acyclic_siblings` cannot see: a package whose
`__init__` imports one of its own descendants while that descendant imports the package back, directly or through
other modules (`rules/__init__.py` re-exporting `rules.table` while `rules/table.py` takes a name from
`gpufrac.webhook.decide.rules`). `acyclic_siblings` squashes each child with its descendants and looks for circles
among the siblings only, so a package's own `__init__` is never one of the nodes it looks at; every other circle
runs between two siblings somewhere below the packages' common ancestor, and `acyclic_siblings` finds it there.

Registered under `contract_types` in .importlinter and .importlinter-tests, as kopf registers its own contract type,
on import-linter's public plugin API (`Contract`, `ContractCheck`, `fields`, `output`) and grimp's graph queries.
"""

from __future__ import annotations

from collections.abc import Iterator

import grimp
from importlinter import Contract, ContractCheck, fields, output


class PackageCyclesContract(Contract):
    """No package below `packages` (nor one of them) is in an import circle with its own descendants."""

    packages = fields.ListField(subfield=fields.ModuleField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        roots = [module.name for module in self.packages]  # type: ignore[attr-defined]
        circles = sorted({circle for root in roots for circle in _circles_through_packages(graph, root)})
        return ContractCheck(kept=not circles, metadata={"circles": circles})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for circle in check.metadata["circles"]:
            output.print_error(f"{' -> '.join(circle)}: the package's __init__ imports its own descendant, "
                               "which imports the package back.")
            output.new_line()


def _circles_through_packages(graph: grimp.ImportGraph, root: str) -> Iterator[tuple[str, ...]]:
    """For each package under `root` (and `root`) that imports a descendant of its own: the shortest way back from
    that descendant to the package, as `package -> descendant -> ... -> package`."""
    for package in sorted({root} | graph.find_descendants(root)):
        inside = graph.find_descendants(package)
        for module in sorted(graph.find_modules_directly_imported_by(package) & inside):
            back = graph.find_shortest_chain(importer=module, imported=package)
            if back:
                yield (package, *back)
