"""The Grafana dashboard (charts/gpufrac/dashboards/gpufrac.json) is one Grafana loads and lays out as meant.

No Grafana server can be installed on this machine (no Debian package; the Go module is not one to use; npm and
PyPI carry only client libraries), so nothing renders it here. What a render would catch is checked on the JSON:
the dashboard model's fields, panel ids, the 24-column grid without overlaps, a Prometheus data source through
the dashboard's own variable, every variable a query uses defined, units Grafana knows, and legends that name
only labels their query keeps. That every metric and label the queries read is exported, and that each query
parses as PromQL, is checked against the real endpoints in tests/e2e/test_monitoring.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from testkit.dashboard import kept_labels, load_dashboard, panels

PANEL_TYPES = {"row", "timeseries", "stat", "bargauge", "gauge", "table", "text", "state-timeline"}
# Grafana's unit ids (packages/grafana-data valueFormats) that fit what gpufrac exports.
UNITS = {"short", "none", "s", "ms", "reqps", "ops", "percentunit", "bytes", "decbytes", "dateTimeFromNow",
         "dateTimeAsIso"}
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"}
GRID_COLUMNS = 24


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load_dashboard()


def test_the_dashboard_model(dashboard):
    assert dashboard["uid"] == "gpufrac" and re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"])
    assert dashboard["title"] and isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["time"]["from"].startswith("now-") and dashboard["time"]["to"] == "now"
    assert "id" not in dashboard  # Grafana's database id: set on import, never in a provisioned file


def test_panels_have_unique_ids_types_and_titles(dashboard):
    ids = [p["id"] for p in dashboard["panels"]]
    assert all(isinstance(i, int) and i > 0 for i in ids) and len(set(ids)) == len(ids), ids
    for panel in dashboard["panels"]:
        assert panel["type"] in PANEL_TYPES, panel["type"]
        assert panel["title"].strip(), panel


def test_the_grid_fits_24_columns_without_overlaps(dashboard):
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert set(grid) == {"h", "w", "x", "y"} and all(isinstance(v, int) for v in grid.values()), panel["title"]
        assert grid["w"] >= 1 and grid["h"] >= 1 and grid["x"] >= 0 and grid["y"] >= 0
        assert grid["x"] + grid["w"] <= GRID_COLUMNS, f"{panel['title']} runs past column {GRID_COLUMNS}"
        if panel["type"] == "row":
            assert grid["w"] == GRID_COLUMNS and grid["h"] == 1 and grid["x"] == 0
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]
    rows = sorted(p["gridPos"]["y"] for p in dashboard["panels"] if p["type"] == "row")
    assert rows and rows[0] == 0, "panels above the first row"


def test_every_query_uses_the_prometheus_datasource_variable(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    wanted = {"type": "prometheus", "uid": "${datasource}"}
    for panel in panels(dashboard):
        assert panel["datasource"] == wanted, panel["title"]
        targets = panel["targets"]
        assert targets, f"{panel['title']} has no query"
        ref_ids = [t["refId"] for t in targets]
        assert len(set(ref_ids)) == len(ref_ids), panel["title"]
        for target in targets:
            assert target.get("datasource", wanted) == wanted and target["expr"].strip(), panel["title"]
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == wanted, variable["name"]


def test_every_variable_a_query_uses_is_defined(dashboard):
    defined = {v["name"] for v in dashboard["templating"]["list"]} | GRAFANA_BUILTINS
    for panel in panels(dashboard):
        for target in panel["targets"]:
            used = set(re.findall(r"\$\{?(\w+)", target["expr"])) - defined
            assert not used, f"{panel['title']}: undefined variables {sorted(used)}"
    namespace = next(v for v in dashboard["templating"]["list"] if v["name"] == "namespace")
    assert namespace["includeAll"] and namespace["allValue"] == ".*"  # `=~"$namespace"` with All selects all
    uses = [t["expr"] for p in panels(dashboard) for t in p["targets"] if "$namespace" in t["expr"]]
    assert uses and all('namespace=~"$namespace"' in e for e in uses), uses  # a multi-value variable needs =~


def test_units_are_grafanas_and_ratios_show_as_percent(dashboard):
    for panel in panels(dashboard):
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        assert unit in UNITS, f"{panel['title']}: unit {unit!r}"
        exprs = " ".join(t["expr"] for t in panel["targets"])
        if "_ratio" in exprs or re.search(r"_bytes\{[^}]*\}\s*/", exprs):
            assert unit == "percentunit", panel["title"]
        elif "_bytes" in exprs:
            assert unit in {"bytes", "decbytes"}, panel["title"]
        if "_seconds" in exprs and "histogram_quantile" in exprs:
            assert unit == "s", panel["title"]


def test_legends_name_only_labels_their_query_keeps(dashboard):
    for panel in panels(dashboard):
        for target in panel["targets"]:
            legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
            kept = kept_labels(target["expr"])
            if kept is not None:
                assert legend <= kept, f"{panel['title']}: legend {sorted(legend - kept)} dropped by the query"
    assert kept_labels("sum by (a, le) (rate(x[5m]))") == {"a"} and kept_labels("x / y") is None
