"""The chart's day-2 options: where the pods schedule, what GKE and IPv6 clusters need, network policies, the
monitoring objects. Rendered with the real helm (`make tools`); skipped without it, like tests/chart/test_chart.py."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest

from testkit.chart import (
    CERT_MANAGER,
    CHART,
    K8S_VERSION,
    NS,
    arg_value,
    container,
    find,
    helm,
    mutating,
    needs_helm,
    one,
    render,
    validating,
)

pytestmark = needs_helm

MONITORING_APIS = [f"monitoring.coreos.com/v1/{kind}" for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule")]
MONITORING_ON = ["--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.podMonitor.enabled=true",
                 "--set", "monitoring.prometheusRule.enabled=true", "--set", "monitoring.dashboard.enabled=true"]
WITH_MONITORING_CRDS = [arg for api in MONITORING_APIS for arg in ("--api-versions", api)]
EVERYTHING = [*MONITORING_ON, *WITH_MONITORING_CRDS, "--set", "criticalPodsQuota.enabled=true",
              "--set", "networkPolicy.enabled=true"]


@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return render()


def pod_specs(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    specs = {}
    for o in objs:
        if o["kind"] in ("Deployment", "DaemonSet", "Job"):
            specs[f"{o['kind']}/{o['metadata']['name']}"] = o["spec"]["template"]["spec"]
        elif o["kind"] == "CronJob":
            specs[f"CronJob/{o['metadata']['name']}"] = o["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return specs


def node_matches(affinity: dict[str, Any], labels: dict[str, str]) -> bool:
    """The scheduler's rule for required node affinity with `In`: any term whose every expression holds."""
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    for term in terms:
        exprs = term["matchExpressions"]
        assert all(e["operator"] == "In" for e in exprs)
        if all(labels.get(e["key"]) in e["values"] for e in exprs):
            return True
    return False


# --- where the pods go --------------------------------------------------------------------------------------


@pytest.mark.parametrize("labels, scheduled", [
    ({"feature.node.kubernetes.io/pci-10de.present": "true"}, True),  # NFD on a discrete-GPU node
    ({"feature.node.kubernetes.io/cpu-model.vendor_id": "NVIDIA"}, True),  # NFD on Tegra
    ({"nvidia.com/gpu.present": "true"}, True),  # the GPU Operator, or by hand
    ({"feature.node.kubernetes.io/pci-10de.present": "false", "nvidia.com/gpu.present": "false"}, False),
    ({"feature.node.kubernetes.io/pci-8086.present": "true"}, False),
    ({}, False),
], ids=["nfd-pci", "nfd-tegra", "gpu-present", "labelled-false", "other-vendor", "unlabelled"])
def test_agent_goes_where_the_device_plugin_goes(default, labels, scheduled):
    spec = one(default, "DaemonSet", "gpufrac-agent")["spec"]["template"]["spec"]
    assert node_matches(spec["affinity"], labels) is scheduled


def test_every_pod_runs_on_linux_and_keeps_its_own_selector():
    objs = render("--set", "webhook.nodeSelector.pool=system", "--set", "agent.nodeSelector.gpu=yes",
                  "--set", "certs.selfManaged.nodeSelector.pool=system")
    specs = pod_specs(objs)
    assert len(specs) == 7  # webhook, agent, MPS daemons, two certificate hook Jobs, CronJob, the uninstall hook
    for name, spec in specs.items():
        assert spec["nodeSelector"]["kubernetes.io/os"] == "linux", name
    assert specs["Deployment/gpufrac-webhook"]["nodeSelector"] == {"kubernetes.io/os": "linux", "pool": "system"}
    assert specs["DaemonSet/gpufrac-agent"]["nodeSelector"] == {"kubernetes.io/os": "linux", "gpu": "yes"}
    assert specs["DaemonSet/gpufrac-mps"]["nodeSelector"] == {"kubernetes.io/os": "linux", "gpu": "yes"}
    assert specs["CronJob/gpufrac-certs"]["nodeSelector"] == {"kubernetes.io/os": "linux", "pool": "system"}
    assert specs["Job/gpufrac-agent-withdraw"]["nodeSelector"] == {"kubernetes.io/os": "linux", "pool": "system"}


def test_certificate_jobs_schedule_on_tainted_clusters(default):
    for spec in pod_specs(default).values():
        if spec["containers"][0]["name"] == "rotate":
            assert "tolerations" not in spec and "priorityClassName" not in spec
    objs = render("--set", "certs.selfManaged.tolerations[0].operator=Exists",
                  "--set", "certs.selfManaged.priorityClassName=platform-critical",
                  "--set", "certs.selfManaged.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
                           "[0].weight=1",
                  "--set", "certs.selfManaged.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
                           "[0].preference.matchExpressions[0].key=pool",
                  "--set", "certs.selfManaged.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
                           "[0].preference.matchExpressions[0].operator=Exists")
    jobs = {n: s for n, s in pod_specs(objs).items() if s["containers"][0]["name"] == "rotate"}
    assert set(jobs) == {"Job/gpufrac-certs-init", "Job/gpufrac-certs-sync", "CronJob/gpufrac-certs"}
    for spec in jobs.values():
        assert spec["tolerations"] == [{"operator": "Exists"}]
        assert spec["priorityClassName"] == "platform-critical"
        assert spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 1


def test_webhook_mounts_no_token_the_agent_and_jobs_do(default):
    specs = pod_specs(default)
    assert specs["Deployment/gpufrac-webhook"]["automountServiceAccountToken"] is False
    assert one(default, "ServiceAccount", "gpufrac-webhook")["automountServiceAccountToken"] is False
    assert specs["DaemonSet/gpufrac-mps"]["automountServiceAccountToken"] is False, "the MPS daemons call no API"
    # The agent and the certificate jobs call the API server.
    for name, spec in specs.items():
        if name not in ("Deployment/gpufrac-webhook", "DaemonSet/gpufrac-mps"):
            assert spec.get("automountServiceAccountToken", True) is True, name


# --- namespace, priority classes ----------------------------------------------------------------------------


def test_default_namespace_is_refused_unless_allowed():
    r = helm("template", "gpufrac", str(CHART), "--namespace", "default", check=False)
    assert r.returncode != 0
    assert "must not be installed into the default namespace" in r.stderr and "allowDefaultNamespace" in r.stderr
    objs = render("--set", "allowDefaultNamespace=true", namespace="default")
    assert one(objs, "Deployment")["metadata"]["namespace"] == "default"


def test_critical_pods_quota_is_a_toggle(default):
    assert not find(default, "ResourceQuota")
    (quota,) = find(render("--set", "criticalPodsQuota.enabled=true"), "ResourceQuota")
    assert quota["metadata"]["namespace"] == NS
    (expr,) = quota["spec"]["scopeSelector"]["matchExpressions"]
    assert expr == {"scopeName": "PriorityClass", "operator": "In",
                    "values": ["system-node-critical", "system-cluster-critical"]}
    assert quota["spec"]["hard"] == {"pods": "1G"}
    # The classes it admits are the ones the chart's pods ask for.
    specs = pod_specs(default)
    assert {specs["Deployment/gpufrac-webhook"]["priorityClassName"],
            specs["DaemonSet/gpufrac-agent"]["priorityClassName"]} <= set(expr["values"])


# --- network ------------------------------------------------------------------------------------------------


def test_bind_addresses_follow_the_pods_family(default):
    for kind, flag in (("Deployment", "--bind"), ("Deployment", "--metrics-bind"), ("DaemonSet", "--metrics-bind")):
        c = container(one(default, kind, "gpufrac-agent" if kind == "DaemonSet" else None))
        (bind,) = arg_value(c["args"], flag)
        assert bind.startswith(":"), f"{kind} {flag} {bind}: a fixed host pins one IP family"
        (pod_ip,) = [e for e in c["env"] if e["name"] == "POD_IP"]
        assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_secure_port_host_network_and_dns_policy(default):
    spec = one(default, "Deployment")["spec"]["template"]["spec"]
    assert "hostNetwork" not in spec and "dnsPolicy" not in spec
    objs = render("--set", "webhook.containerPort=10260", "--set", "webhook.hostNetwork=true",
                  "--set", "webhook.metrics.port=10261")
    dep = one(objs, "Deployment")
    spec = dep["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    c = container(dep)
    assert arg_value(c["args"], "--bind") == [":10260"] and arg_value(c["args"], "--metrics-bind") == [":10261"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"https": 10260, "metrics": 10261}
    svc = one(objs, "Service", "gpufrac-webhook")
    assert {p["name"]: p["targetPort"] for p in svc["spec"]["ports"]} == {"https": "https", "metrics": "metrics"}
    assert mutating(objs)["clientConfig"]["service"]["port"] == 443  # the Service port stays
    spec = one(render("--set", "webhook.dnsPolicy=Default"), "Deployment")["spec"]["template"]["spec"]
    assert spec["dnsPolicy"] == "Default" and "hostNetwork" not in spec


def test_metrics_port_must_not_be_the_admission_port():
    r = helm("template", "gpufrac", str(CHART), "--namespace", NS, "--set", "webhook.metrics.port=8443",
             check=False)
    assert r.returncode != 0 and "webhook.metrics.port must differ from webhook.containerPort" in r.stderr
    assert render("--set", "webhook.metrics.port=8443", "--set", "webhook.metrics.enabled=false")


def test_metrics_port_can_be_turned_off():
    objs = render("--set", "webhook.metrics.enabled=false")
    c = container(one(objs, "Deployment"))
    assert "--metrics-bind" not in c["args"] and [p["name"] for p in c["ports"]] == ["https"]
    assert [p["name"] for p in one(objs, "Service", "gpufrac-webhook")["spec"]["ports"]] == ["https"]


def test_network_policies(default):
    assert not find(default, "NetworkPolicy")
    api_server = {"ipBlock": {"cidr": "172.16.0.0/28"}}
    objs = render("--set", "networkPolicy.enabled=true",
                  "--set", "networkPolicy.webhookFrom[0].ipBlock.cidr=172.16.0.0/28",
                  "--set", "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.name=monitoring")
    scrapers = {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}
    webhook = one(objs, "NetworkPolicy", "gpufrac-webhook")
    dep = one(objs, "Deployment")
    assert webhook["spec"]["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert webhook["spec"]["policyTypes"] == ["Ingress", "Egress"] and webhook["spec"]["egress"] == []
    https, metrics = webhook["spec"]["ingress"]
    assert https == {"ports": [{"port": "https", "protocol": "TCP"}], "from": [api_server]}
    assert metrics == {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": [scrapers]}
    agent = one(objs, "NetworkPolicy", "gpufrac-agent")
    assert agent["spec"]["policyTypes"] == ["Ingress"]  # it calls the API server
    assert agent["spec"]["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}], "from": [scrapers]}]
    # Any source when no peers are named; hostNetwork pods are beyond NetworkPolicy.
    open_objs = render("--set", "networkPolicy.enabled=true")
    assert all("from" not in rule for rule in one(open_objs, "NetworkPolicy", "gpufrac-webhook")["spec"]["ingress"])
    assert not find(render("--set", "networkPolicy.enabled=true", "--set", "webhook.hostNetwork=true"),
                    "NetworkPolicy", "gpufrac-webhook")


def test_webhook_configuration_annotations():
    objs = render("--set-string", "webhook.configurationAnnotations.argocd\\.argoproj\\.io/sync-wave=5")
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert one(objs, kind)["metadata"]["annotations"] == {"argocd.argoproj.io/sync-wave": "5"}
    objs = render(*CERT_MANAGER, "--set", "webhook.configurationAnnotations.team=gpu")
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert one(objs, kind)["metadata"]["annotations"] == {
            "team": "gpu", "cert-manager.io/inject-ca-from": f"{NS}/gpufrac-webhook-serving"}
    assert mutating(objs)["name"] == "mutate.gpufrac.io" and validating(objs)["name"] == "validate.gpufrac.io"


# --- monitoring -----------------------------------------------------------------------------------------------


def test_monitoring_objects_need_their_crds():
    objs = render(*MONITORING_ON)  # helm template knows no monitoring.coreos.com API
    assert not [o for o in objs if o["apiVersion"].startswith("monitoring.coreos.com/")]
    assert find(objs, "ConfigMap", "gpufrac-dashboard")  # a ConfigMap needs no CRD
    objs = render(*MONITORING_ON, *WITH_MONITORING_CRDS)
    assert {o["kind"] for o in objs if o["apiVersion"] == "monitoring.coreos.com/v1"} == {
        "ServiceMonitor", "PodMonitor", "PrometheusRule"}
    assert not [o for o in render(*WITH_MONITORING_CRDS) if o["apiVersion"].startswith("monitoring.coreos.com/")]


def test_service_and_pod_monitors():
    objs = render(*MONITORING_ON, *WITH_MONITORING_CRDS, "--set", "monitoring.podMonitor.labels.release=prom")
    sm = one(objs, "ServiceMonitor")
    svc = one(objs, "Service", "gpufrac-webhook")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["selector"]["matchLabels"] == one(objs, "Deployment")["spec"]["selector"]["matchLabels"]
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["scheme"] == "http"
    pm = one(objs, "PodMonitor")
    assert pm["metadata"]["labels"]["release"] == "prom"
    agent = one(objs, "DaemonSet", "gpufrac-agent")
    assert pm["spec"]["selector"]["matchLabels"] == agent["spec"]["selector"]["matchLabels"]
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in endpoint["relabelings"]
    for monitor in (sm, pm):
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NS]}


def test_prometheus_rule_covers_the_failures_operators_page_on():
    objs = render(*MONITORING_ON, *WITH_MONITORING_CRDS)
    rules = {r["alert"]: r for g in one(objs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    assert set(rules) == {
        "GpufracWebhookUnavailable", "GpufracWebhookCallsFailing", "GpufracWebhookErrors", "GpufracWebhookSlow",
        "GpufracCertificateExpiringSoon", "GpufracCertificateNotRenewed", "GpufracCertificateRotationFailed",
        "GpufracCertificateRotationStale", "GpufracAgentNotScheduled",
        "GpufracMpsDaemonDown", "GpufracNvmlDown", "GpufracViolations", "GpufracContainersOverLimit",
        "GpufracGpuMemoryGuaranteeShort", "GpufracNodeRuntimeProblem", "GpufracNriUnavailable",
        "GpufracStackPodVoided", "GpufracMpsVersionSkew"}
    assert "gpufrac_nri_daemonset_pods_total" in rules["GpufracStackPodVoided"]["expr"]
    assert "gpufrac_mps_version_skew" in rules["GpufracMpsVersionSkew"]["expr"]
    assert "< 1209600" in rules["GpufracCertificateExpiringSoon"]["expr"]  # 14 days
    assert 'daemonset="gpufrac-agent"' in rules["GpufracAgentNotScheduled"]["expr"]
    assert 'deployment="gpufrac-webhook"' in rules["GpufracWebhookUnavailable"]["expr"]
    assert 'cronjob="gpufrac-certs"' in rules["GpufracCertificateRotationStale"]["expr"]
    # Due for renewal 30 days (the CA 365) before expiry, and the rotation runs daily: two days past due.
    not_renewed = rules["GpufracCertificateNotRenewed"]["expr"]
    assert 'certificate="serving"}) - time()) < 2419200' in not_renewed  # 28 days
    assert 'certificate="ca"}) - time()) < 31363200' in not_renewed  # 363 days
    # A Job whose retry succeeded has failed pods but is no failure: the Job's Failed condition counts.
    assert 'condition="true"' in rules["GpufracCertificateRotationFailed"]["expr"]
    assert "kube_job_status_failed" not in rules["GpufracCertificateRotationFailed"]["expr"]
    for rule in rules.values():
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and "{{ $labels" not in rule["expr"]
    objs = render(*MONITORING_ON, *WITH_MONITORING_CRDS, *CERT_MANAGER, "--set", "agent.enabled=false",
                  "--set", "monitoring.prometheusRule.certificateExpiryDays=30")
    rules = {r["alert"]: r for g in one(objs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    assert "GpufracCertificateRotationFailed" not in rules and "GpufracMpsDaemonDown" not in rules
    assert "GpufracCertificateRotationStale" not in rules and "GpufracCertificateNotRenewed" not in rules
    assert "< 2592000" in rules["GpufracCertificateExpiringSoon"]["expr"]


def test_every_alert_has_a_runbook_url_pointing_at_an_anchor_of_the_runbook():
    """The runbook (docs/monitoring.md, "Runbook") has a heading per alert; GitHub's anchor of `### Name` is
    `#name`."""
    runbook = (CHART.parent.parent / "docs" / "monitoring.md").read_text()
    anchors = {line[4:].strip().lower() for line in runbook.splitlines() if line.startswith("### ")}
    objs = render(*MONITORING_ON, *WITH_MONITORING_CRDS)
    rules = [r for g in one(objs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    for rule in rules:
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert page == "https://github.com/gpufrac/gpufrac/blob/main/docs/monitoring.md", rule["alert"]
        assert anchor == rule["alert"].lower() and anchor in anchors, rule["alert"]


def test_dashboard_configmap_carries_the_dashboard_file():
    (cm,) = find(render(*MONITORING_ON), "ConfigMap", "gpufrac-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["gpufrac.json"]) == json.loads((CHART / "dashboards" / "gpufrac.json").read_text())


@pytest.mark.parametrize("bad", [
    "webhook.dnsPolicy=Sometimes", "webhook.metrics.port=0", "monitoring.prometheusRule.webhookErrorRatio=2",
    "monitoring.podMonitor.interval=often", "networkPolicy.enabled=perhaps", "criticalPodsQuota.toggle=true",
    "allowDefaultNamespace=sure",
])
def test_schema_rejects_wrong_operations_values(bad):
    r = helm("template", "gpufrac", str(CHART), "--namespace", NS, "--set", bad, check=False)
    assert r.returncode != 0 and ("schema" in r.stderr or "values don't meet" in r.stderr), r.stderr


@pytest.mark.parametrize("values", [EVERYTHING, [*EVERYTHING, *CERT_MANAGER]], ids=["self-managed", "cert-manager"])
def test_everything_on_passes_lint_and_kubernetes_schema(values):
    lint = helm("lint", "--strict", str(CHART), "--namespace", NS,
                *[v for v in values if not v.startswith("--api-versions") and v not in MONITORING_APIS], check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    objs = render(*values)
    kinds = {o["kind"] for o in objs}
    assert {"NetworkPolicy", "ResourceQuota", "ConfigMap", "ServiceMonitor", "PodMonitor", "PrometheusRule"} <= kinds
    for obj in objs:
        if obj["apiVersion"].split("/")[0] in ("cert-manager.io", "monitoring.coreos.com"):
            continue  # CRDs: applied against their real definitions in tests/e2e/test_chart_apply.py
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpufrac"
