"""The failures the webhook tells apart: a pod that breaks the rules, and a review that is not a review."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

SHOWN_VALUE_MAX = 64
PLAIN_VALUE_PATTERN = r"^[\x21-\x7e]{1,64}$"  # printable ASCII, no space: shown bare (the policies use it too)
_PLAIN_VALUE = re.compile(PLAIN_VALUE_PATTERN)


def show_value(value: str) -> str:
    """A value as a denial message shows it: bare when plain, JSON-quoted when empty or odd, cut when long."""
    if _PLAIN_VALUE.fullmatch(value):
        return value
    if len(value) > SHOWN_VALUE_MAX:
        return json.dumps(value[:SHOWN_VALUE_MAX], ensure_ascii=True)[:-1] + f'…" ({len(value)} characters)'
    return json.dumps(value, ensure_ascii=True)


@dataclass(frozen=True)
class Violation:
    """One broken rule, said so a person can act on it: what, the value, and what would be accepted."""

    subject: str  # e.g. "annotation gpu-fraction", "container app"
    problem: str  # e.g. "must be a decimal number strictly between 0 and 1, such as 0.5"
    value: str | None = None
    where: str = ""  # in a workload, the pod template it is about: "spec.template"

    def __str__(self) -> str:
        said = f"{self.subject}: {self.problem}" if self.value is None else \
            f"{self.subject}: {show_value(self.value)} {self.problem}"
        return f"{self.where}: {said}" if self.where else said


def annotation(key: str, value: str | None, problem: str) -> Violation:
    return Violation(f"annotation {key}", problem, value)


class BadReviewError(Exception):
    """The request is not an AdmissionReview we can answer: HTTP 400 with a JSON error, never a 500."""

    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
