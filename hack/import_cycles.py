"""No import circle anywhere in the repository (`make lint`): one line per cycle, exit 1 if there is one.

import-linter sees only inside its root package; this sees every package of the repo at once. Stdlib only: the
module graph is built with `ast` from the source, and every import counts, at module level or inside a function
(a lazy import still makes the two modules know each other). `from pkg import name` is an edge to `pkg.name`
when that is a module, else to `pkg`; importing a module does not count as importing its parent packages (an
`__init__` that re-exports its submodules would otherwise close a circle with each of them).

Usage: python hack/import_cycles.py [ROOT]   (ROOT: the repository, default: this file's parent's parent)
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from collections.abc import Iterator
from pathlib import Path

PACKAGES = ("gpufrac", "testkit", "tests", "e2e", "bench", "gpucheck", "hack")
# Generated at build time (make stubs), never committed: their imports are protoc's, not ours.
SKIP_PARTS = {"generated", "__pycache__"}

# Cycles that are known and owned by a change under way: one line each, as this script prints them (the
# rotation starting at the smallest module name). Empty means none is tolerated. A listed cycle that no longer
# exists is an error too, so the list only shrinks.
ALLOWED: frozenset[str] = frozenset()


def modules(root: Path) -> dict[str, Path]:
    """Every module of the repo's packages: dotted name -> file."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        base = root / package
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            if SKIP_PARTS & set(rel.parts):
                continue
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            found[".".join(parts)] = path
    return found


def _imported(tree: ast.AST, module: str, is_package: bool, known: dict[str, Path]) -> set[str]:
    """The modules of ours this module imports. `import a.b.c`: the deepest of ours among a.b.c, a.b, a;
    `from a.b import c`: a.b.c when that is a module, else a.b (c is a name from its namespace)."""
    package = module if is_package else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - (node.level - 1)], *([base] if base else [])])
            names += [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    targets = {_deepest_known(name, known) for name in names}
    return {t for t in targets if t is not None and t != module}


def _deepest_known(name: str, known: dict[str, Path]) -> str | None:
    """The deepest module of ours that `name` names (`a.b.C` -> `a.b`), or None for another package's."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def graph(root: Path) -> dict[str, set[str]]:
    """module -> the modules of ours it imports."""
    known = modules(root)
    edges: dict[str, set[str]] = {}
    for module, path in known.items():
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        except (SyntaxError, UnicodeDecodeError) as err:
            raise SystemExit(f"import_cycles: cannot parse {path}: {err}") from None
        edges[module] = _imported(tree, module, path.name == "__init__.py", known)
    return edges


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components, iteratively (the graph is deep enough for recursion limits)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def _shortest_cycle_through(start: str, members: set[str], edges: dict[str, set[str]]) -> list[str]:
    """The shortest path start -> ... -> start inside one component (breadth first)."""
    parents: dict[str, str] = {}
    queue = deque([start])
    seen = {start}
    while queue:
        node = queue.popleft()
        for child in sorted(edges[node] & members):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(parents[path[-1]])
                return path[::-1]
            if child not in seen:
                seen.add(child)
                parents[child] = node
                queue.append(child)
    raise AssertionError(f"{start} is in a component without a cycle through it")


def _normalized(cycle: list[str]) -> str:
    """A cycle as one line, rotated to start at its smallest module: `a -> b -> a`."""
    first = cycle.index(min(cycle))
    rotated = cycle[first:] + cycle[:first]
    return " -> ".join([*rotated, rotated[0]])


def cycles(edges: dict[str, set[str]]) -> list[str]:
    """For every module inside a circle, the shortest circle through it (each distinct circle once)."""
    found: set[str] = set()
    for component in strongly_connected(edges):
        members = set(component)
        for module in component:
            found.add(_normalized(_shortest_cycle_through(module, members, edges)))
    return sorted(found)


def main(argv: list[str]) -> int:
    root = Path(argv[1]).resolve() if len(argv) > 1 else Path(__file__).resolve().parent.parent
    edges = graph(root)
    found = cycles(edges)
    new = [c for c in found if c not in ALLOWED]
    gone = sorted(ALLOWED - set(found))
    for cycle in new:
        print(f"import cycle: {cycle}")
    for cycle in gone:
        print(f"allowed import cycle no longer exists, remove it from ALLOWED in {Path(__file__).name}: {cycle}")
    tolerated = len(found) - len(new)
    if new or gone:
        return 1
    print(f"import_cycles: no import cycle in {len(edges)} modules"
          + (f" ({tolerated} allowed, see ALLOWED)" if tolerated else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
