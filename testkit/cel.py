"""CEL evaluated by cel-python (`celpy`), a real implementation of the language, for the tests of the logic of the
chart's CEL: what an expression yields for a given `object` and `oldObject`, with CEL's own rules (a field read
without `has()` on an object that lacks it is an error, `null` is not a missing field, `exists` on a map iterates
its keys). The API server itself compiles and runs the same expressions in the e2e tests."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError, Result, base_functions

_ENV = celpy.Environment()


def null_aware(operator: str) -> Callable[[Result, Result], Result]:
    """CEL's `==` or `!=` (`operator`: "_==_" or "_!=_") where one side may be null, as the API server's cel-go has
    them: a value against null is unequal unless it is null too (`oldObject != null` is true on an UPDATE).
    cel-python answers a map, a list or a number against null with "no such overload"; everything else is its own."""
    own = base_functions[operator]
    equal = operator == "_==_"

    def compare(left: Result, right: Result) -> Result:
        if left is None or right is None:
            return celtypes.BoolType((left is None and right is None) == equal)
        return own(left, right)

    return compare


# Given to every program in place of cel-python's own operators (its public override of `base_functions`).
FUNCTIONS = {"_==_": null_aware("_==_"), "_!=_": null_aware("_!=_")}


@cache
def _program(expression: str) -> celpy.Runner:
    """Parsed once per expression: the chart tests evaluate the same few conditions on many objects."""
    return _ENV.program(_ENV.compile(expression), functions=FUNCTIONS)


def evaluate(expression: str, **variables: Any) -> Any:
    """The value of `expression` with these variables (JSON-shaped Python values; None is CEL's null). Raises
    celpy.CELParseError for text that is not CEL (or that cel-python does not parse), CELEvalError for an
    evaluation error (the API server would answer it with the failure policy)."""
    result = _program(expression).evaluate({name: json_to_cel(value) for name, value in variables.items()})
    if isinstance(result, CELEvalError):
        raise result
    return result


def condition(expression: str, obj: dict[str, Any] | None, old: dict[str, Any] | None) -> bool:
    """A matchCondition's verdict on a request with this object and oldObject (None: null, as on a CREATE)."""
    result = evaluate(expression, object=obj, oldObject=old)
    if not isinstance(result, celtypes.BoolType):
        raise TypeError(f"a matchCondition must evaluate to a bool, this one gave {type(result).__name__}: "
                        f"{expression}")
    return bool(result)
