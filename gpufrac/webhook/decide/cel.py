"""Writing CEL (the Common Expression Language the API server evaluates admission policies in) from Python values.

Pure. Every literal a generated policy holds (a key, a pattern, a message) comes from the Python constant the webhook
uses, through these helpers, so the two engines say the same thing (docs/architecture.md, "Which rule runs where").
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from gpufrac.webhook.decide.errors import PLAIN_VALUE_PATTERN, SHOWN_VALUE_MAX

ANNOTATIONS = "variables.anns"  # the object's annotations, {} when it has none


def lit(text: str) -> str:
    """A CEL string literal (JSON's escapes are CEL's too)."""
    return json.dumps(text, ensure_ascii=False)


def regex(pattern: str) -> str:
    """A CEL raw string holding an RE2 pattern (the Python patterns used here are RE2's subset)."""
    if '"' in pattern:
        raise ValueError(f"a pattern with a double quote cannot be a raw CEL string: {pattern}")
    return f'r"{pattern}"'


def str_list(items: Iterable[str]) -> str:
    return "[" + ", ".join(lit(i) for i in items) + "]"


def cat(*parts: str) -> str:
    """Concatenation of CEL string expressions."""
    return " + ".join(parts)


def show(value: str) -> str:
    """`errors.show_value` in CEL: bare when plain, quoted when empty or odd, cut when long. Quotes, backslashes and
    non-ASCII characters are not JSON-escaped as the webhook does (CEL has no JSON encoder)."""
    quote, cut, characters = lit('"'), lit('…" ('), lit(" characters)")
    return (f"({value}.matches({regex(PLAIN_VALUE_PATTERN)}) ? {value} : (size({value}) > {SHOWN_VALUE_MAX} ? "
            f"{quote} + {value}.substring(0, {SHOWN_VALUE_MAX}) + {cut} + string(size({value})) + {characters} : "
            f"{quote} + {value} + {quote}))")


def annotation_message(key: str, value: str | None, problem: str) -> str:
    """`errors.annotation(key, value, problem)` as a CEL string expression; key, value and problem are CEL."""
    said = cat(lit("annotation "), key, lit(": "))
    if value is not None:
        said = cat(said, show(value), lit(" "))
    return cat(said, problem)


def when(condition: str, messages: str) -> str:
    """A list of messages that is empty unless `condition` holds."""
    return f"(({condition}) ? {messages} : [])"


def one(message: str) -> str:
    return f"[{message}]"


def ann(key: str) -> str:
    """The value of annotation `key` (a Python string), to be used where `has_ann(key)` holds."""
    return f"{ANNOTATIONS}[{lit(key)}]"


def has_ann(key: str) -> str:
    return f"({lit(key)} in {ANNOTATIONS})"
