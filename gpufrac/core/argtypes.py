"""Argument types of the command lines (argparse `type=`): a bad value names itself and what is accepted."""

from __future__ import annotations

import argparse


def _whole_number(text: str, least: int, accepted: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; expected {accepted}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {accepted}")
    return value


def positive_int(text: str) -> int:
    """A whole number of at least 1 (a count, a validity in days)."""
    return _whole_number(text, 1, "a whole number of at least 1")


def non_negative_int(text: str) -> int:
    """A whole number of at least 0 (a margin or a wait, where 0 means none)."""
    return _whole_number(text, 0, "a whole number of at least 0")
