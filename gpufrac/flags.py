"""The `gpufrac` command's flags mirrored from the environment, through argparse's public API only.

Every long flag can be set as `GPUFRAC_<FLAG>` (`--log-level` is `GPUFRAC_LOG_LEVEL`); a flag on the command line
wins, and `--help` names each flag's variable and default. argparse offers no public way to list a parser's actions
or to ask what kind an action is, so `FlagParser` keeps what it was given: each action `add_argument` returns, with
the `action=` it was declared with, and the parsers of its subcommands (made through `add_subparsers`'
`parser_class`).
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "GPUFRAC_"
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")
# The `action=` values whose flag takes no value (a switch) or collects many.
SWITCHES = ("store_true", "store_false", argparse.BooleanOptionalAction)
REPEATABLE = ("append", "extend")
UNMIRRORED = ("help", "version")


@dataclass(frozen=True)
class Flag:
    """One declared argument: the action argparse made, the `action=` it was declared with."""

    action: argparse.Action
    kind: object

    @property
    def variable(self) -> str | None:
        """`--log-level` -> GPUFRAC_LOG_LEVEL; None for positionals and --help/--version."""
        longs = [o for o in self.action.option_strings if o.startswith("--")]
        if not longs or self.kind in UNMIRRORED:
            return None
        return ENV_PREFIX + longs[0][2:].replace("-", "_").upper()

    @property
    def repeatable(self) -> bool:
        return self.kind in REPEATABLE


class FlagParser(argparse.ArgumentParser):
    """An ArgumentParser that remembers its flags and its subcommands' parsers, and names each flag's variable and
    default in its help."""

    def __init__(self, *args: Any, parent: FlagParser | None = None, **kwargs: Any) -> None:
        self.flags: list[Flag] = []  # before argparse's __init__, which adds --help through add_argument
        self.subcommands: list[FlagParser] = []
        if parent is not None:
            parent.subcommands.append(self)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        flag = Flag(action, kwargs.get("action", "store"))
        self.flags.append(flag)
        if flag.variable is not None:
            action.help = _help_with_variable(action, flag)
        return action

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", functools.partial(FlagParser, parent=self))
        return super().add_subparsers(**kwargs)


def _help_with_variable(action: argparse.Action, flag: Flag) -> str:
    text = action.help or ""
    if "(default" not in text and action.default not in (None, False, [], "", argparse.SUPPRESS):
        text += " (default: %(default)s)"
    return text + f" [${flag.variable}{', comma-separated' if flag.repeatable else ''}]"


def parsers(parser: FlagParser) -> Iterator[FlagParser]:
    """The parser and every subcommand's, depth first."""
    yield parser
    for sub in parser.subcommands:
        yield from parsers(sub)


def mirrored(parser: FlagParser) -> Iterator[tuple[FlagParser, Flag]]:
    """Every flag that has a variable, with the parser it belongs to."""
    for each in parsers(parser):
        for flag in each.flags:
            if flag.variable is not None:
                yield each, flag


class _EnvironmentList(list[Any]):
    """A repeatable flag's values from the environment. argparse copies the default before it appends the first
    flag's value: this copy starts empty, so flags on the command line replace the variable's list."""

    def __copy__(self) -> list[Any]:
        return []


def _from_environment(flag: Flag, value: str, variable: str) -> None:
    """Make an environment value the flag's default; argparse converts and checks it like a typed-in value."""
    action = flag.action
    if flag.kind in SWITCHES:
        if value.strip().lower() not in TRUE + FALSE:
            raise SystemExit(f"gpufrac: ${variable}={value!r}: expected true or false")
        action.default = value.strip().lower() in TRUE
    elif flag.repeatable:
        convert: Callable[[str], Any] = action.type if callable(action.type) else str
        action.default = _EnvironmentList(convert(v.strip()) for v in value.split(",") if v.strip())
    else:
        action.default = value
    action.required = False
    if action.help and "(default" not in action.help and action.default not in (None, False, [], ""):
        head, _, tail = action.help.rpartition(" [$")
        action.help = f"{head} (default: %(default)s) [${tail}"


def apply_environment(parser: FlagParser, environ: Mapping[str, str] | os._Environ[str]) -> None:
    for _, flag in mirrored(parser):
        variable = flag.variable
        if variable is not None and variable in environ:
            _from_environment(flag, environ[variable], variable)
