"""gpufrac uses gunicorn, `ssl`, `logging` and `argparse` through their public API only: no `_name` of theirs is read,
written, imported or overridden from gpufrac/, and none of their module attributes is patched (issue 33: the server
was held together by private internals and a `gunicorn<28` pin; one release could break admission everywhere; issue
46: the command line read argparse's `_actions` and its private action classes).

What counts, found by reading gpufrac's source (ast):
- `from gunicorn.x import _y`, and `mod._y` on a name bound to one of these modules or to anything imported from them;
- in a class that extends one of theirs, `self._y` / `cls._y` / `super()._y`, and defining a `_y` method or class
  attribute (it would override, or shadow, a private one of theirs);
- `x._y` on any other object, where `_y` is a private name gunicorn, ssl or logging define (their installed source
  is read for those names): an object gunicorn hands to a hook (worker, request, response, socket) is theirs;
- assigning to an attribute of one of these modules (monkeypatching), but for the switches logging documents.
"""

from __future__ import annotations

import argparse
import ast
import logging
import ssl
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import gunicorn

ROOT = Path(__file__).resolve().parents[2]
WATCHED = ("gunicorn", "ssl", "logging", "argparse")
# logging's documented switches, meant to be set ("Optimization" in the logging HOWTO; logging.raiseExceptions).
DOCUMENTED_SWITCHES = {"logThreads", "logProcesses", "logMultiprocessing", "logAsyncioTasks", "raiseExceptions"}


def _watched(module: str | None) -> bool:
    return module is not None and module.split(".")[0] in WATCHED


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _sources() -> Iterator[Path]:
    yield Path(logging.__file__)
    yield from Path(logging.__file__).parent.glob("*.py")
    yield Path(ssl.__file__)
    yield Path(argparse.__file__)
    yield from Path(gunicorn.__file__).parent.rglob("*.py")


@cache
def their_private_names() -> frozenset[str]:
    """Every `_name` gunicorn, ssl and logging define: module globals, class members, attributes set on self."""
    names: set[str] = set()
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and _private(node.name):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and _private(node.id):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _private(node.attr):
                names.add(node.attr)
    return frozenset(names)


def _root(node: ast.expr) -> ast.expr:
    """The name an expression starts from: `a` for `a.b().c[0]`."""
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _member_names(item: ast.stmt) -> list[str]:
    """What a statement in a class body defines: a method, a nested class, class attributes."""
    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [item.name]
    if isinstance(item, ast.Assign):
        return [t.id for t in item.targets if isinstance(t, ast.Name)]
    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
        return [item.target.id]
    return []


class PrivateAccess(ast.NodeVisitor):
    """Collects `(line, what)` for every private access of gunicorn, ssl or logging in one module."""

    def __init__(self) -> None:
        self.bound: set[str] = set()  # local names of these modules and of what was imported from them
        self.found: list[tuple[int, str]] = []
        self.extending: list[bool] = []  # per enclosing class: does it extend one of theirs?

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if _watched(alias.name):
                self.bound.add(alias.asname or alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and _watched(node.module):
            for alias in node.names:
                if _private(alias.name):
                    self.found.append((node.lineno, f"imports {node.module}.{alias.name}"))
                self.bound.add(alias.asname or alias.name)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        extends = any(self._theirs(base) for base in node.bases)
        if extends:
            for item in node.body:
                for name in filter(_private, _member_names(item)):
                    self.found.append((item.lineno, f"class {node.name} defines {name} over a class of theirs"))
        self.extending.append(extends)
        self.generic_visit(node)
        self.extending.pop()

    def _theirs(self, node: ast.expr) -> bool:
        root = _root(node)
        return isinstance(root, ast.Name) and root.id in self.bound

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if _private(node.attr):
            self._check_private(node)
        elif isinstance(node.ctx, ast.Store) and self._is_their_module_or_class(node.value) \
                and node.attr not in DOCUMENTED_SWITCHES:
            self.found.append((node.lineno, f"patches {ast.unparse(node.value)}.{node.attr}"))
        self.generic_visit(node)

    def _is_their_module_or_class(self, node: ast.expr) -> bool:
        """`gthread`, `logging.Logger`: a module of theirs or what it holds, not an object made by calling it."""
        while isinstance(node, ast.Attribute):
            node = node.value
        return isinstance(node, ast.Name) and node.id in self.bound

    def _check_private(self, node: ast.Attribute) -> None:
        value = node.value
        what = f"{ast.unparse(value)}.{node.attr}"
        own = isinstance(value, ast.Name) and value.id in ("self", "cls")
        via_super = isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"
        if self._theirs(value):
            self.found.append((node.lineno, f"reads or writes {what}"))
        elif (own or via_super) and self.extending and self.extending[-1]:
            self.found.append((node.lineno, f"{what} in a class that extends one of theirs"))
        elif not own and not via_super and node.attr in their_private_names():
            self.found.append((node.lineno, f"{what}: {node.attr} is a private name of gunicorn, ssl or logging"))

    def visit_Call(self, node: ast.Call) -> None:
        """getattr/setattr/hasattr/delattr with a private name of theirs, or on an object of theirs."""
        if isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr", "hasattr", "delattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and _private(node.args[1].value) \
                and (self._theirs(node.args[0]) or node.args[1].value in their_private_names()):
            self.found.append((node.lineno, f"{node.func.id}({ast.unparse(node.args[0])}, {node.args[1].value!r})"))
        self.generic_visit(node)


def private_accesses(source: str) -> list[tuple[int, str]]:
    checker = PrivateAccess()
    checker.visit(ast.parse(source))
    return checker.found


def test_gpufrac_touches_no_private_attribute_of_gunicorn_ssl_logging_or_argparse() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {what}"
             for path in sorted((ROOT / "gpufrac").rglob("*.py"))
             for line, what in private_accesses(path.read_text(encoding="utf-8"))]
    assert found == []


# What the server did before issue 33, and the command line before issue 46, one line each: the check must find
# every one.
PLANTED = '''
import argparse
import logging
import ssl
from gunicorn import glogging
from gunicorn.workers import gthread
from gunicorn.workers.gthread import _DEFER

logging._srcfile = None
gthread.DEFAULT_WORKER_DATA_TIMEOUT = 0.5

class QuietAccessLogger(glogging.Logger):
    def _compute_access_log_enabled(self):
        return super()._compute_access_log_enabled()

    def setup(self, cfg):
        self._access_log_enabled = False

class DeadlineSSLSocket(ssl.SSLSocket):
    _deadline = None

def post_request(worker, req, environ, resp):
    return resp._omits_body or getattr(worker, "_accepting")

class HelpFormatter(argparse.HelpFormatter):
    def _get_help_string(self, action):
        return action.help

def flags(parser):
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
'''


def test_the_check_finds_each_kind_of_private_access() -> None:
    found = private_accesses(PLANTED)
    lines = PLANTED.splitlines()
    hit = {lines[line - 1].strip() for line, _ in found}
    assert hit == {
        "from gunicorn.workers.gthread import _DEFER",
        "logging._srcfile = None",
        "gthread.DEFAULT_WORKER_DATA_TIMEOUT = 0.5",
        "def _compute_access_log_enabled(self):",
        "return super()._compute_access_log_enabled()",
        "self._access_log_enabled = False",
        "_deadline = None",
        "return resp._omits_body or getattr(worker, \"_accepting\")",
        "def _get_help_string(self, action):",
        "return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]",
    }, found


def test_public_use_and_gpufracs_own_private_names_pass() -> None:
    source = '''
import logging
from gunicorn import glogging

logging.logThreads = False
log = logging.getLogger(__name__)

class AccessLogger(glogging.Logger):
    def access(self, resp, req, environ, request_time):
        if self.access_log.isEnabledFor(logging.INFO):
            super().access(resp, req, environ, request_time)

class Gate:
    def __init__(self):
        self._turns = 0

    def turn(self):
        self._turns += 1
'''
    assert private_accesses(source) == []
