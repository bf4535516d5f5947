"""The bench report's through-apiserver section, from cells given as data: every server's row, the figures set
against the cluster without webhooks, and the target line naming the do-nothing floors. No timing is measured."""

from __future__ import annotations

from bench.apiserver import ApiCell, ApiResult
from bench.chart import chart_webhook
from bench.report import Report

MACHINE = {"date": "d", "cpu": "c", "python": "p", "os": "o", "load": "0.10 0.20 0.30"}


def cell(server: str, p50_ms: float, pods: int = 100, errors: int = 0, first_error: str = "") -> ApiCell:
    c = ApiCell(server, 1, latencies=[p50_ms / 1000] * pods, seconds=pods * p50_ms / 1000, errors=errors,
                first_error=first_error)
    if server != "none":
        c.webhook_calls = {"mutate.gpufrac.io": [pods * 0.002, pods], "validate.gpufrac.io": [pods * 0.001, pods]}
    return c


def api_section(cells: dict[tuple[str, int], ApiCell], skipped: dict[str, str] | None = None) -> tuple[str, Report]:
    report = Report("smoke", MACHINE, chart_webhook(), [])
    report.api = ApiResult(cells, "v1.36.3", 1.0, skipped or {}, 1, 5.0,
                           [("MutatingWebhookConfiguration", "gpufrac"), ("ValidatingWebhookConfiguration", "gpufrac")])
    return "\n".join(report._api()), report


def test_each_server_has_a_row_against_none_and_the_target_names_the_floors():
    p50s = {"gpufrac": 10.0, "gpufrac's answers replayed": 8.5, "do-nothing": 8.0, "do-nothing (Go)": 7.5,
            "none": 4.0}
    text, report = api_section({(server, 1): cell(server, ms) for server, ms in p50s.items()})
    assert "| 1 | gpufrac | 100 | 100.0 | 10.0 |" in text
    assert "| 1 | gpufrac's answers replayed | 100 | 117.6 | 8.5 |" in text
    assert "| 1 | do-nothing | 100 | 125.0 | 8.0 |" in text and "+4.0 ms p50" in text
    assert "| 1 | do-nothing (Go) | 100 | 133.3 | 7.5 |" in text and "+3.5 ms p50" in text
    assert "1 client, gpufrac: mutate.gpufrac.io 2.0 ms (100 calls), validate.gpufrac.io 1.0 ms (100 calls)" in text
    target, measured, verdict = report.targets[-1]
    assert target.startswith("through kube-apiserver: p50 added to a pod CREATE at 1 client ≤ 3 ms")
    assert measured == ("+6.0 ms (10.0 vs 4.0 ms; gpufrac's answers replayed +4.5 ms; do-nothing +4.0 ms; "
                        "do-nothing (Go) +3.5 ms; load 0.10 0.20 0.30)")
    assert verdict == "**missed**"


def test_a_server_not_measured_says_why_and_errors_are_quoted():
    text, report = api_section({("gpufrac", 1): cell("gpufrac", 5.0, errors=3, first_error="webhook refused"),
                                ("none", 1): cell("none", 4.0)}, {"do-nothing (Go)": "no Go toolchain on PATH"})
    assert "Not measured: do-nothing (Go), no Go toolchain on PATH." in text
    assert "First error, gpufrac at 1 client: webhook refused" in text
    assert report.targets[-1][1] == "+1.0 ms (5.0 vs 4.0 ms; load 0.10 0.20 0.30)"
    assert report.targets[-1][2] == "**met**"


def test_the_nri_section_sets_creation_with_the_plugin_beside_without_it():
    report = Report("smoke", MACHINE, chart_webhook(), [])
    report.nri = {"without": {"n": 80, "p50_ms": 30.0, "p95_ms": 41.0, "mean_ms": 31.5},
                  "with": {"n": 80, "p50_ms": 31.2, "p95_ms": 43.0, "mean_ms": 32.0}, "added_p50_ms": 1.2,
                  "plugin_cpu_ms_per_container": 0.61, "decided": 82, "rounds": 2, "per_round": 40,
                  "load": (1.5, 1.2, 1.0), "outcomes": {"injected": 42, "voided": 40},
                  "by_kind": {"with": {"fraction": {"n": 40, "p50_ms": 33.0, "p95_ms": 44.0, "mean_ms": 33.5}}}}
    text = "\n".join(report._nri())
    assert "| without a plugin | 80 | 30.0 | 41.0 | 31.5 |" in text
    assert "| with gpufrac's plugin | 80 | 31.2 | 43.0 | 32.0 |" in text
    assert "| with gpufrac's plugin: the bound fraction | 40 | 33.0 | 44.0 | 33.5 |" in text
    assert "adds 1.2 ms at the median" in text
    assert "0.61 ms per container it decided (82 decided: 42 injected, 40 voided)" in text
    assert "Load average at the end 1.50, 1.20, 1.00" in text
    report.nri = {"skipped": "the real node needs root"}
    assert "the real node needs root" in "\n".join(report._nri())


def test_the_policies_cell_shows_their_cost_in_latency_and_api_server_cpu():
    on, off = cell("gpufrac + policies", 11.0), cell("gpufrac", 10.0)
    on.cpu_seconds, off.cpu_seconds = {"kube-apiserver": 0.5, "webhook": 0.2}, {"kube-apiserver": 0.4, "webhook": 0.2}
    text, report = api_section({("gpufrac + policies", 1): on, ("gpufrac", 1): off, ("none", 1): cell("none", 4.0)})
    assert "| 1 | gpufrac + policies | 100 | 90.9 | 11.0 | 11.0 | 5.00 | 2.00 |" in text
    assert ("The ValidatingAdmissionPolicies, at 1 client: a pod CREATE +1.0 ms p50 (11.0 with, 10.0 without), "
            "+1.00 ms of API server CPU and +0.00 ms of webhook CPU per pod") in text
    assert "gpufrac + policies +" not in report.targets[-1][1]  # the floors are the stand-ins, not the policies
