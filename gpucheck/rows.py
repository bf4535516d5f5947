"""A row of the check's table: its id, name, status (PASS, FAIL or SKIPPED), the reason and the raw numbers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PASS, FAIL, SKIPPED = "PASS", "FAIL", "SKIPPED"


@dataclass
class Row:
    id: str
    name: str
    status: str
    details: str
    numbers: dict[str, Any] = field(default_factory=dict)
