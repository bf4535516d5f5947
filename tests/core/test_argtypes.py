"""The command lines' whole-number types: one name per bound, and a bad value names itself and what is accepted,
through argparse as a person sees it."""

from __future__ import annotations

import argparse

import pytest

from gpufrac.core.argtypes import non_negative_int, positive_int


@pytest.mark.parametrize(("parse", "text", "value"), [
    (positive_int, "1", 1), (positive_int, "365", 365), (non_negative_int, "0", 0), (non_negative_int, "60", 60),
])
def test_whole_numbers_at_their_bound_are_taken(parse, text, value):
    assert parse(text) == value


@pytest.mark.parametrize(("parse", "text", "message"), [
    (positive_int, "0", "'0': expected a whole number of at least 1"),
    (positive_int, "-3", "'-3': expected a whole number of at least 1"),
    (non_negative_int, "-1", "'-1': expected a whole number of at least 0"),
    (positive_int, "1.5", "'1.5' is not a whole number; expected a whole number of at least 1"),
    (non_negative_int, "soon", "'soon' is not a whole number; expected a whole number of at least 0"),
])
def test_a_bad_value_is_refused_with_what_is_accepted(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError) as err:
        parse(text)
    assert str(err.value) == message


def test_argparse_reports_the_option_and_the_value(capsys):
    parser = argparse.ArgumentParser(prog="gpufrac certs rotate")
    parser.add_argument("--attempts", type=positive_int)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--attempts", "0"])
    assert exit_.value.code == 2
    assert "argument --attempts: '0': expected a whole number of at least 1" in capsys.readouterr().err
