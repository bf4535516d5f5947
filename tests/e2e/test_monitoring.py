"""Every series the chart's dashboard and alerts read exists: both real metrics endpoints are scraped — the
webhook process's plain-HTTP metrics port after real reviews, and `gpufrac agent` on the GPU fakes against the
control plane — and each metric name in the rendered PrometheusRule and in dashboards/gpufrac.json must be among
the scraped series (or be one of the few kube-state-metrics and kube-apiserver series named below), with the
labels the queries filter and group by."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from e2e.agent_world import GPU_UUIDS, AgentWorld
from e2e.names import CHART_DIR, RELEASE_NAMESPACE, REPO_ROOT
from e2e.testing import unique
from e2e.toolkit.wait import wait_until
from gpufrac.certs.generate import issue_ca, issue_serving_cert, write_serving_files
from testkit.dashboard import kept_labels, load_dashboard
from testkit.pods import pod
from testkit.reviews import review_body

pytestmark = pytest.mark.e2e

# Series from elsewhere that the rules read, by who exports them. Anything else must come from gpufrac.
EXTERNAL = {
    "kube_deployment_status_replicas_available": "kube-state-metrics",
    "kube_daemonset_status_desired_number_scheduled": "kube-state-metrics",
    "kube_daemonset_status_number_available": "kube-state-metrics",
    "kube_job_failed": "kube-state-metrics",
    "kube_cronjob_status_last_successful_time": "kube-state-metrics",
    "apiserver_admission_webhook_rejection_count": "kube-apiserver",
}
# Labels Prometheus adds to every series of a target scraped through the chart's ServiceMonitor/PodMonitor
# (`node` by their relabeling), and `le` of histogram buckets.
TARGET_LABELS = {"namespace", "pod", "container", "service", "endpoint", "job", "instance", "node", "le"}

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                "offset", "inf", "nan"}


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names it uses) for each series a PromQL expression reads: names in selectors, with the
    labels of their matchers and of the by/without/on clauses of the expression."""
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range and subquery durations, $__rate_interval
    grouping: set[str] = set()
    for clause in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        grouping |= {label.strip() for label in clause.split(",") if label.strip()}
    expr = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", expr)
    found = []
    for match in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?\s*(\()?", expr):
        name, matchers, call = match.groups()
        if call or name.lower() in PROMQL_WORDS or expr[max(0, match.start() - 1)] in "$\"'":
            continue
        labels = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", matchers or ""))
        found.append((name, labels | grouping))
    return found


def test_selectors_parse_what_the_queries_say():
    assert selectors('sum by (le, endpoint) (rate(a_bucket{namespace="x", result!="y"}[5m])) > 1') == [
        ("a_bucket", {"le", "endpoint", "namespace", "result"})]
    assert selectors("min by (certificate) (b) - time() < 3") == [("b", {"certificate"})]
    assert selectors('c == 0 and on (node) d{mode=~"a|b"}') == [("c", {"node"}), ("d", {"node", "mode"})]


PROMQL_CHECK = REPO_ROOT / "tests" / "tools" / "promqlcheck"
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "1h", "$namespace": ".*"}


def promqlcheck() -> Path:
    """Prometheus' own PromQL parser as a small binary (tests/tools/promqlcheck), built once per source."""
    digest = hashlib.sha256(b"".join((PROMQL_CHECK / f).read_bytes() for f in ("main.go", "go.mod", "go.sum")))
    out = Path(os.environ.get("GPUFRAC_TOOLS_CACHE", Path.home() / ".cache/gpufrac/tools")) / "bin" / \
        f"promqlcheck-{digest.hexdigest()[:12]}"
    if not out.exists():
        env = {**os.environ, "GOFLAGS": "-modcacherw -buildvcs=false", "GOTOOLCHAIN": "local",
               "GOMODCACHE": str(out.parent.parent.parent / "gomod")}
        subprocess.run(["go", "build", "-o", str(out), "."], cwd=PROMQL_CHECK, env=env, check=True, timeout=900,
                       capture_output=True)
    return out


def rendered_alerts() -> dict[str, str]:
    """Alert name -> expression, of the chart's PrometheusRule with the default values."""
    argv = [str(Path(os.environ.get("GPUFRAC_TOOLS_CACHE", Path.home() / ".cache/gpufrac/tools")) / "bin/helm"),
            "template", "gpufrac", str(CHART_DIR), "--namespace", RELEASE_NAMESPACE,
            "--set", "monitoring.prometheusRule.enabled=true",
            "--api-versions", "monitoring.coreos.com/v1/PrometheusRule"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
    (rule,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "PrometheusRule"]
    return {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}


def rendered_rules() -> list[str]:
    return list(rendered_alerts().values())


def dashboard_queries() -> list[str]:
    dashboard = load_dashboard()
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":  # Grafana's label_values(metric, label): the label of that metric
            metric, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variable["query"]["query"]).groups()
            queries.append(f'{metric}{{{label}!=""}}')
    return queries


class WebhookProcess:
    """`gpufrac webhook` with its plain-HTTP metrics port, as the chart runs it."""

    def __init__(self, workdir: Path) -> None:
        certs = workdir / "certs"
        ca = issue_ca("monitoring-test-ca")
        write_serving_files(certs, ca, issue_serving_cert(ca, days=30))
        self.certs, self.port, self.metrics_port = certs, _free_port(), _free_port()
        self._log = open(workdir / "webhook.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpufrac", "webhook", "--certs", str(certs), "--bind", f"127.0.0.1:{self.port}",
             "--metrics-bind", f"127.0.0.1:{self.metrics_port}", "--workers", "2", "--threads", "2"],
            cwd=REPO_ROOT, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(self._up, 60, "the webhook's metrics port")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the webhook exited with {self.proc.returncode}")
        with contextlib.suppress(OSError):
            return bool(self.metrics())
        return False

    def post(self, path: str, body: bytes) -> int:
        import http.client
        import ssl
        context = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))
        conn = http.client.HTTPSConnection("localhost", self.port, context=context, timeout=10)
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            return resp.read().decode()

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._log.close()


def scraped_with(scrape, fragment: str) -> str | None:
    text = scrape()
    return text if fragment in text else None


def series(text: str) -> dict[str, set[str]]:
    """Sample name -> the label names it carries."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


@pytest.fixture(scope="module")
def webhook_series(tmp_path_factory) -> dict[str, set[str]]:
    server = WebhookProcess(tmp_path_factory.mktemp("webhook-metrics"))
    try:
        allowed = review_body(pod({"gpu-fraction": "0.5"}), operation="CREATE")
        denied = review_body(pod({"gpu-fraction": "1.5"}), operation="CREATE")
        assert server.post("/mutate", json.dumps(allowed).encode()) == 200
        assert server.post("/mutate", json.dumps(denied).encode()) == 200
        assert server.post("/validate", json.dumps(denied).encode()) == 200
        assert server.post("/validate", b"not json") == 400
        text = wait_until(lambda: scraped_with(server.metrics, 'result="error"'), 30, "all results")
    finally:
        server.stop()
    found = series(text)
    assert 'reason="annotation gpu-fraction"' in text
    assert "_created" not in text
    return found


@pytest.fixture(scope="module")
def agent_series(cluster, tmp_path_factory, fresh_namespace, request) -> Iterator[dict[str, set[str]]]:
    with fresh_namespace(cluster, f"{request.node.nodeid}::agent_series") as ns:
        yield _agent_series(AgentWorld(cluster, tmp_path_factory.mktemp("agent-metrics"), namespace=ns))


def _agent_series(world: AgentWorld) -> dict[str, set[str]]:
    world.start_agent()
    try:
        fp = world.create_pod(unique("monitoring-fraction"), gpu_uuid=GPU_UUIDS[0], limit_mib=8000)
        world.start_process(fp, used_mib=1000, sm_util=30)
        text = wait_until(lambda: scraped_with(world.metrics, f'pod="{fp.name}"'), 60, "usage series")
    finally:
        try:
            world.stop_agent()
        finally:
            world.delete_pods(*world.created)
    assert "_created" not in text
    return series(text)


def test_webhook_metrics_port_serves_what_operators_need(webhook_series):
    for name in ("gpufrac_admission_reviews_total", "gpufrac_admission_review_duration_seconds_bucket",
                 "gpufrac_admission_denials_total", "gpufrac_certificate_expiration_timestamp_seconds",
                 "gpufrac_build_info"):
        assert name in webhook_series, name
    assert webhook_series["gpufrac_admission_denials_total"] == {"webhook", "reason"}


def test_agent_usage_series_join_with_dcgm_exporter(agent_series):
    labels = agent_series["gpufrac_container_gpu_sm_utilization_ratio"]
    assert {"UUID", "Hostname", "namespace", "pod", "container"} <= labels
    assert not [n for n in agent_series if n.endswith("_percent")]


def test_every_query_parses_as_promql():
    """Prometheus' parser reads every alert expression and dashboard query (Grafana's variables filled in)."""
    queries = rendered_rules()
    for query in dashboard_queries():
        for variable, value in GRAFANA_VARIABLES.items():
            query = query.replace(variable, value)
        queries.append(query)
    result = subprocess.run([str(promqlcheck())], input=json.dumps(queries), capture_output=True, text=True,
                            timeout=60)
    verdicts = result.stdout.splitlines()
    assert len(verdicts) == len(queries), result.stderr
    bad = [f"{q}: {v}" for q, v in zip(queries, verdicts, strict=True) if v != "ok"]
    assert not bad and result.returncode == 0, "\n".join(bad)
    broken = subprocess.run([str(promqlcheck())], input=json.dumps(["sum by (a (x"]), capture_output=True,
                            text=True, timeout=60)
    assert broken.returncode == 1 and "parse error" in broken.stdout  # the check can fail


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_series_the_chart_queries_is_exported(webhook_series, agent_series, source):
    exported = {**webhook_series, **agent_series}
    queries = rendered_rules() if source == "rules" else dashboard_queries()
    assert queries
    used = [s for q in queries for s in selectors(q)]
    assert used, queries
    for name, labels in used:
        if name in EXTERNAL:
            continue
        assert name.startswith("gpufrac_"), f"{name}: neither gpufrac's nor a known external series"
        assert name in exported, f"{source} read {name}, which neither endpoint exports"
        unknown = labels - exported[name] - TARGET_LABELS
        assert not unknown, f"{source} filter or group {name} by {sorted(unknown)}, which it does not carry"


def test_dashboard_legends_name_labels_the_series_carry(webhook_series, agent_series):
    """A legend of a query that does not aggregate names labels of the series it reads (tests/chart/test_dashboard.py
    checks those that aggregate)."""
    exported = {**webhook_series, **agent_series}
    dashboard = load_dashboard()
    checked = 0
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            if kept_labels(target["expr"]) is not None:
                continue
            legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
            for name, _ in selectors(target["expr"]):
                missing = legend - exported[name] - TARGET_LABELS
                assert not missing, f"{panel['title']}: {name} has no label {sorted(missing)}"
                checked += 1
    assert checked


# ---- the certificate alerts fire when they should (Prometheus' own engine, promqltest's `load` notation) --------

DAY = 86400
EVAL_AT = 10 * DAY  # time() when the alerts are evaluated
CERT_ALERTS = {"GpufracCertificateExpiringSoon", "GpufracCertificateNotRenewed", "GpufracCertificateRotationFailed",
               "GpufracCertificateRotationStale"}


def certificate_world(serving_days: float = 300, ca_days: float = 3000, job_failed: bool = False,
                      last_success_days_ago: float = 0.5) -> list[str]:
    """Series as Prometheus holds them (two webhook replicas scraped; kube-state-metrics' Job and CronJob
    series), constant over the ten days before EVAL_AT."""
    ns = f'namespace="{RELEASE_NAMESPACE}"'
    lines = []
    for replica in ("gpufrac-webhook-a", "gpufrac-webhook-b"):
        for certificate, days in (("serving", serving_days), ("ca", ca_days)):
            lines.append(f'gpufrac_certificate_expiration_timestamp_seconds{{{ns}, pod="{replica}", '
                         f'certificate="{certificate}"}} {EVAL_AT + days * DAY:.0f}')
    job = f'{ns}, job_name="gpufrac-certs-29400000"'
    lines += [f'kube_job_failed{{{job}, condition="true"}} {int(job_failed)}',
              f'kube_job_failed{{{job}, condition="false"}} {int(not job_failed)}',
              f'kube_job_status_failed{{{job}}} 1',  # a retried pod failed in either case
              f'kube_cronjob_status_last_successful_time{{{ns}, cronjob="gpufrac-certs"}} '
              f'{EVAL_AT - last_success_days_ago * DAY:.0f}']
    return lines


CERTIFICATE_CASES = {
    "healthy": ({}, set()),
    "serving certificate past its renewal": ({"serving_days": 27}, {"GpufracCertificateNotRenewed"}),
    "serving certificate expiring": ({"serving_days": 10},
                                     {"GpufracCertificateNotRenewed", "GpufracCertificateExpiringSoon"}),
    "CA past its renewal": ({"ca_days": 360}, {"GpufracCertificateNotRenewed"}),
    "rotation job failed": ({"job_failed": True}, {"GpufracCertificateRotationFailed"}),
    "rotation CronJob stale": ({"last_success_days_ago": 3}, {"GpufracCertificateRotationStale"}),
}


@pytest.mark.parametrize("case", list(CERTIFICATE_CASES))
def test_certificate_alerts_fire_when_renewal_fails(case):
    world, expected = CERTIFICATE_CASES[case]
    alerts = {name: expr for name, expr in rendered_alerts().items() if name in CERT_ALERTS}
    assert set(alerts) == CERT_ALERTS
    load = "load 1h\n" + "".join(f"  {line}+0x250\n" for line in certificate_world(**world))
    names = sorted(alerts)
    result = subprocess.run([str(promqlcheck()), "eval"], capture_output=True, text=True, timeout=120,
                            input=json.dumps({"load": load, "at": f"{EVAL_AT // DAY}d",
                                              "exprs": [alerts[n] for n in names]}))
    assert result.returncode == 0, result.stdout + result.stderr
    firing = {name for name, count in zip(names, result.stdout.split(), strict=True) if int(count) > 0}
    assert firing == expected, case


# ---- the series as Prometheus stores them behind the Prometheus Operator -------------------------------------------
#
# The operator turns each ServiceMonitor/PodMonitor endpoint into a scrape config whose relabel_configs set the
# target's labels (namespace, service, pod, container, job, endpoint, ...) before the chart's own relabelings; with
# honor_labels false a scraped label of the same name is renamed exported_<name>. operator_scrape_config() writes
# that config the way the operator's generator does (pkg/prometheus/promcfg.go; its testdata/*.golden show the
# shape), from the rendered monitor; `promqlcheck scrape` then scrapes the real webhook and agent with Prometheus'
# own scrape manager and evaluates every dashboard query and alert against what it stored.

SCRAPE_INTERVAL = "1s"  # the monitors' interval, shortened so that a few scrapes take seconds


def _meta_name(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", label)


def _snake(relabelings: list[dict]) -> list[dict]:
    """The operator's RelabelConfig (camelCase) as Prometheus' relabel_config."""
    words = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return [{words.get(k, k): v for k, v in r.items()} for r in relabelings or []]


def operator_scrape_config(monitor: dict) -> dict:
    """The scrape config the Prometheus Operator generates for the monitor's first endpoint."""
    kind, meta, spec = monitor["kind"], monitor["metadata"], monitor["spec"]
    service = kind == "ServiceMonitor"
    (endpoint,) = spec["endpoints"] if service else spec["podMetricsEndpoints"]
    on = "service" if service else "pod"
    port_label = "__meta_kubernetes_endpoint_port_name" if service else "__meta_kubernetes_pod_container_port_name"
    relabel = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    for key, value in sorted(spec["selector"]["matchLabels"].items()):
        relabel.append({"action": "keep", "source_labels": [f"__meta_kubernetes_{on}_label_{_meta_name(key)}",
                                                            f"__meta_kubernetes_{on}_labelpresent_{_meta_name(key)}"],
                        "regex": f"({value});true"})
    relabel.append({"action": "keep", "source_labels": [port_label], "regex": endpoint["port"]})
    if service:
        for target_kind, label in (("Node", "node"), ("Pod", "pod")):
            relabel.append({"source_labels": ["__meta_kubernetes_endpoint_address_target_kind",
                                              "__meta_kubernetes_endpoint_address_target_name"],
                            "separator": ";", "regex": f"{target_kind};(.*)", "replacement": "${1}",
                            "target_label": label})
    relabel.append({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"})
    if service:
        relabel.append({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"})
    relabel += [{"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
                {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}]
    relabel.append({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"}
                   if service else {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"})
    relabel.append({"target_label": "endpoint", "replacement": endpoint["port"]})
    relabel += _snake(endpoint.get("relabelings"))
    relabel += [{"source_labels": ["__address__"], "target_label": "__tmp_hash", "modulus": 1, "action": "hashmod"},
                {"source_labels": ["__tmp_hash"], "regex": "0", "action": "keep"}]
    config = {"job_name": f"{'serviceMonitor' if service else 'podMonitor'}/{meta['namespace']}/{meta['name']}/0",
              "honor_labels": bool(endpoint.get("honorLabels", False)), "scrape_interval": SCRAPE_INTERVAL,
              "scrape_timeout": SCRAPE_INTERVAL, "metrics_path": endpoint.get("path", "/metrics"),
              "scheme": endpoint.get("scheme", "http"), "relabel_configs": relabel}
    if endpoint.get("metricRelabelings"):
        config["metric_relabel_configs"] = _snake(endpoint["metricRelabelings"])
    return config


def rendered_monitors(*values: str) -> dict[str, dict]:
    argv = [str(Path(os.environ.get("GPUFRAC_TOOLS_CACHE", Path.home() / ".cache/gpufrac/tools")) / "bin/helm"),
            "template", "gpufrac", str(CHART_DIR), "--namespace", RELEASE_NAMESPACE,
            "--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.podMonitor.enabled=true",
            "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor",
            "--api-versions", "monitoring.coreos.com/v1/PodMonitor", *values]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
    return {d["kind"]: d for d in yaml.safe_load_all(out) if d and d["kind"] in ("ServiceMonitor", "PodMonitor")}


def discovered(monitor: dict, address: str, pod_name: str, container: str) -> dict[str, str]:
    """What Kubernetes service discovery reports for the monitor's target (role endpoints or pod)."""
    labels = monitor["spec"]["selector"]["matchLabels"]
    on = "service" if monitor["kind"] == "ServiceMonitor" else "pod"
    target = {"__address__": address, "__meta_kubernetes_namespace": RELEASE_NAMESPACE,
              "__meta_kubernetes_pod_name": pod_name, "__meta_kubernetes_pod_container_name": container,
              "__meta_kubernetes_pod_node_name": "gpu-node-1", "__meta_kubernetes_pod_phase": "Running"}
    for key, value in labels.items():
        target[f"__meta_kubernetes_{on}_label_{_meta_name(key)}"] = value
        target[f"__meta_kubernetes_{on}_labelpresent_{_meta_name(key)}"] = "true"
    if on == "service":
        target |= {"__meta_kubernetes_service_name": "gpufrac-webhook",
                   "__meta_kubernetes_endpoint_port_name": "metrics",
                   "__meta_kubernetes_endpoint_address_target_kind": "Pod",
                   "__meta_kubernetes_endpoint_address_target_name": pod_name}
    else:
        target["__meta_kubernetes_pod_container_port_name"] = "metrics"
    return target


def data_expr(alert: str) -> str:
    """An alert's expression without its threshold comparisons: the series it compares, which must exist."""
    return re.sub(r"\s*(?:[<>]=?|==|!=)\s*-?[0-9][0-9.e+]*(?=\s*(?:\bor\b|\band\b|\bunless\b|$))", "",
                  alert.strip())


@pytest.fixture(scope="module")
def live_targets(cluster, tmp_path_factory, fresh_namespace, request) -> Iterator[dict[str, str]]:
    """The webhook (after a review of each result) and the agent on the GPU fakes, left running to be scraped."""
    with fresh_namespace(cluster, f"{request.node.nodeid}::live_targets") as ns:
        yield from _live_targets(tmp_path_factory, AgentWorld(cluster, tmp_path_factory.mktemp("relabel-agent"),
                                                              namespace=ns))


def _live_targets(tmp_path_factory, world: AgentWorld) -> Iterator[dict[str, str]]:
    server = WebhookProcess(tmp_path_factory.mktemp("relabel-webhook"))
    try:
        for path, annotations in (("/mutate", {"gpu-fraction": "0.5"}), ("/mutate", {"gpu-fraction": "1.5"}),
                                  ("/validate", {"gpu-fraction": "1.5"})):
            assert server.post(path, json.dumps(review_body(pod(annotations), operation="CREATE")).encode()) == 200
        assert server.post("/validate", b"not json") == 400
        world.start_agent()
        fp = world.create_pod(unique("relabel-fraction"), gpu_uuid=GPU_UUIDS[0], limit_mib=8000)
        world.start_process(fp, used_mib=1000, sm_util=30)
        wait_until(lambda: scraped_with(world.metrics, f'pod="{fp.name}"'), 60, "usage series")
        yield {"ServiceMonitor": f"127.0.0.1:{server.metrics_port}", "PodMonitor": f"127.0.0.1:{world.port}"}
    finally:
        server.stop()
        try:
            world.stop_agent()
        finally:
            world.delete_pods(*world.created)


def stored(monitors: dict[str, dict], targets: dict[str, str], exprs: list[str]) -> dict:
    configs = {kind: operator_scrape_config(m) for kind, m in monitors.items()}
    pods = {"ServiceMonitor": ("gpufrac-webhook-6d9f-abcde", "webhook"), "PodMonitor": ("gpufrac-agent-x7k2q", "agent")}
    request = {"config": yaml.safe_dump({"scrape_configs": list(configs.values())}),
               "targets": {configs[k]["job_name"]: [discovered(m, targets[k], *pods[k])] for k, m in monitors.items()},
               "scrapes": 3, "exprs": exprs}
    result = subprocess.run([str(promqlcheck()), "scrape"], input=json.dumps(request), capture_output=True,
                            text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def test_behind_the_operator_every_query_and_alert_reads_the_labels_the_exporters_wrote(live_targets):
    """The series as Prometheus stores them through the operator's relabeling: no gpufrac label was overwritten by
    a target label (renamed exported_*), every label a dashboard query or an alert filters or groups by is there,
    and every dashboard query and every alert's compared series return data."""
    alerts = {name: data_expr(expr) for name, expr in rendered_alerts().items()
              if not any(s in EXTERNAL for s, _ in selectors(expr))}
    queries = dashboard_queries()
    for variable, value in GRAFANA_VARIABLES.items():
        queries = [q.replace(variable, value) for q in queries]
    exprs = queries + list(alerts.values())
    out = stored(rendered_monitors(), live_targets, exprs)
    ours = [s for s in out["series"] if s["__name__"].startswith("gpufrac_")]
    assert {s["job"] for s in ours} == {"gpufrac-webhook", f"{RELEASE_NAMESPACE}/gpufrac-agent"}, ours[:3]
    shadowed = sorted({f"{s['__name__']}: {k}" for s in ours for k in s if k.startswith("exported_")})
    assert not shadowed, f"target labels overwrote what the exporters wrote: {shadowed}"
    carried: dict[str, set[str]] = {}
    for s in ours:
        carried.setdefault(s["__name__"], set()).update(s)
    for expr in exprs:
        for name, labels in selectors(expr):
            if name in carried:
                assert labels <= carried[name], f"{expr}: {name} has no {sorted(labels - carried[name])} as stored"
    empty = [e for e, n in zip(exprs, out["results"], strict=True) if not isinstance(n, int) or n == 0]
    assert not empty, f"queries that return no data (or fail) against the stored series: {empty}"


def test_the_monitors_values_reach_the_scrape(live_targets):
    """honorLabels, relabelings and metricRelabelings on both monitors, as the operator applies them."""
    values = []
    for kind in ("serviceMonitor", "podMonitor"):
        values += ["--set", f"monitoring.{kind}.relabelings[0].targetLabel=cluster",
                   "--set", f"monitoring.{kind}.relabelings[0].replacement=gpu-east",
                   "--set", f"monitoring.{kind}.metricRelabelings[0].action=drop",
                   "--set", f"monitoring.{kind}.metricRelabelings[0].sourceLabels[0]=__name__",
                   "--set", f"monitoring.{kind}.metricRelabelings[0].regex=gpufrac_build_info"]
    values += ["--set", "monitoring.podMonitor.honorLabels=false"]
    out = stored(rendered_monitors(*values), live_targets, [])
    ours = [s for s in out["series"] if s["__name__"].startswith("gpufrac_")]
    assert ours and all(s.get("cluster") == "gpu-east" for s in ours)
    assert not [s for s in ours if s["__name__"] == "gpufrac_build_info"]
    usage = [s for s in ours if s["__name__"] == "gpufrac_container_gpu_memory_used_bytes"]
    assert usage and all(s["namespace"] == RELEASE_NAMESPACE and s["exported_namespace"] != RELEASE_NAMESPACE
                         for s in usage), usage  # without honorLabels the workload's namespace is renamed
