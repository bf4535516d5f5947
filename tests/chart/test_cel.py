"""testkit/cel.py, the CEL evaluator of the chart tests: cel-python with null compared as the API server compares it,
and CEL's own rules for what the chart's conditions lean on (has(), a missing field is an error, exists on a map's
keys). No helm needed."""

from __future__ import annotations

import pytest
from celpy import CELParseError
from celpy.evaluation import CELEvalError

from testkit import cel

POD = {"metadata": {"name": "p", "annotations": {"gpu-fraction": "0.5"}, "labels": {"app": "x"}}}


@pytest.mark.parametrize(("expression", "expected"), [
    ("object != null", True),
    ("object == null", False),
    ("oldObject == null", True),
    ("oldObject != null", False),
    ("null == object", False),
    ("object.metadata.labels != null", True),
    ("[1] != null", True),
    ("1 == null", False),
    ("null == null", True),
    ("null != null", False),
])
def test_a_value_against_null_is_unequal_unless_null_as_the_api_server_has_it(expression, expected):
    assert cel.evaluate(expression, object=POD, oldObject=None) is not None
    assert bool(cel.evaluate(expression, object=POD, oldObject=None)) is expected


def test_the_null_aware_operators_keep_cel_pythons_own_equality_elsewhere():
    assert cel.evaluate("object.metadata == {'name': 'p', 'annotations': {'gpu-fraction': '0.5'}, "
                        "'labels': {'app': 'x'}}", object=POD)
    assert cel.evaluate("object.metadata.name != 'q' && 2 == 2 && 'a' != 'b'", object=POD)
    with pytest.raises(CELEvalError):  # CEL has no 1 == "1": that stays an error
        cel.evaluate("1 == '1'")


def test_has_guards_a_missing_field_and_reading_it_without_has_is_an_error():
    bare = {"metadata": {"name": "p"}}
    assert cel.condition("has(object.metadata.annotations)", POD, None) is True
    assert cel.condition("has(object.metadata.annotations)", bare, None) is False
    with pytest.raises(CELEvalError, match="annotations"):
        cel.condition("object.metadata.annotations.exists(k, true)", bare, None)


def test_exists_iterates_a_maps_keys_and_in_looks_a_key_up():
    assert cel.condition('object.metadata.annotations.exists(k, k.startsWith("gpu-"))', POD, None) is True
    assert cel.condition('object.metadata.annotations.exists(k, k == "0.5")', POD, None) is False
    assert cel.condition('"app" in object.metadata.labels && !("x" in object.metadata.labels)', POD, None) is True


def test_a_condition_must_be_a_bool_and_text_that_is_not_cel_is_refused():
    with pytest.raises(TypeError, match="must evaluate to a bool"):
        cel.condition("object.metadata.name", POD, None)
    with pytest.raises(CELParseError):
        cel.evaluate("object.metadata.(")
