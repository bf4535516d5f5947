"""The chart's Grafana dashboard as data, and what its queries keep: read by the dashboard's unit tests and by the
monitoring e2e test that checks its queries against the real endpoints."""

from __future__ import annotations

import json
import re
from typing import Any

from testkit import REPO_ROOT

DASHBOARD = REPO_ROOT / "charts" / "gpufrac" / "dashboards" / "gpufrac.json"


def load_dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """The panels that show something (not the rows that group them)."""
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def kept_labels(expr: str) -> set[str] | None:
    """The labels the outermost aggregation keeps (`sum by (a, b) (...)`), or None when the query does not
    aggregate at the top (its series keep their own labels)."""
    top = re.match(r"\s*(?:histogram_quantile\([^,]+,\s*)?(?:sum|min|max|avg|count)\s+by\s*\(([^)]*)\)", expr)
    if top is None:
        return None
    return {label.strip() for label in top.group(1).split(",") if label.strip()} - {"le"}
