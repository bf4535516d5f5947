"""The chart's knobs of issue 23: log level and format on every gpufrac container, the agent's and the MPS pods'
security contexts and probes, timeoutSeconds up to 30, the build (--image) both DaemonSets report, the uninstall
hook deleting the self-managed CA Secret, and the monitors' and the dashboard's values."""

from __future__ import annotations

from typing import Any

import pytest

from testkit.chart import CHART, NS, arg_value, container, find, helm, needs_helm, one, render

pytestmark = needs_helm

MONITORING = ["--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.podMonitor.enabled=true",
              "--set", "monitoring.dashboard.enabled=true",
              "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor",
              "--api-versions", "monitoring.coreos.com/v1/PodMonitor"]


def gpufrac_containers(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for obj in objs:
        if obj["kind"] in ("Deployment", "DaemonSet", "Job", "CronJob"):
            spec = obj["spec"]["jobTemplate"]["spec"]["template"]["spec"] if obj["kind"] == "CronJob" \
                else obj["spec"]["template"]["spec"]
            found += [(f"{obj['kind']}/{obj['metadata']['name']}/{c['name']}", c) for c in spec["containers"]
                      if c.get("command") == ["gpufrac"] or (c.get("args") or [""])[0] in ("webhook", "agent")]
    return found


def test_every_gpufrac_container_takes_the_log_level_and_format() -> None:
    containers = gpufrac_containers(render("--set", "log.level=debug", "--set", "log.format=text"))
    names = {name.split("/")[1] for name, _ in containers}
    assert {"gpufrac-webhook", "gpufrac-agent", "gpufrac-mps", "gpufrac-agent-withdraw"} <= names, names
    for name, c in containers:
        args = c["args"]
        assert (arg_value(args, "--log-level"), arg_value(args, "--log-format")) == (["debug"], ["text"]), name
    bad = helm("template", "gpufrac", str(CHART), "-n", NS, "--set", "log.format=yaml", check=False)
    assert bad.returncode != 0 and "/log/format" in bad.stderr


def test_both_daemonsets_name_their_image_for_the_skew_and_mps_is_ready_on_its_control_socket() -> None:
    objs = render("--set", "image.repository=r.example/gpufrac", "--set", "image.tag=1.2.3")
    agent = container(one(objs, "DaemonSet", "gpufrac-agent"))
    assert arg_value(agent["args"], "--image") == ["r.example/gpufrac:1.2.3"]
    mps = one(objs, "DaemonSet", "gpufrac-mps")
    for c in mps["spec"]["template"]["spec"]["containers"]:
        assert arg_value(c["args"], "--image") == ["r.example/gpufrac:1.2.3"]
        assert c["readinessProbe"]["exec"]["command"] == ["test", "-S", f"/run/gpufrac/mps/{c['name']}/control"]
        assert "livenessProbe" not in c  # a restart would cut the daemon's clients
        assert c["securityContext"] == {"privileged": True, "runAsUser": 0, "runAsGroup": 0}
    assert mps["spec"]["updateStrategy"] == {"type": "OnDelete"}


def test_the_agent_and_mps_security_contexts_and_probes_are_values() -> None:
    objs = render("--set", "agent.securityContext.seccompProfile.type=RuntimeDefault",
                  "--set", "agent.readinessProbe.periodSeconds=3", "--set", "agent.livenessProbe=null",
                  "--set", "mps.daemonSet.securityContext.readOnlyRootFilesystem=true",
                  "--set", "mps.daemonSet.readinessProbe.exec=null",
                  "--set", "mps.daemonSet.readinessProbe.tcpSocket.port=1")
    agent = container(one(objs, "DaemonSet", "gpufrac-agent"))
    assert agent["securityContext"] == {"privileged": True, "runAsUser": 0, "runAsGroup": 0,
                                        "seccompProfile": {"type": "RuntimeDefault"}}
    assert agent["readinessProbe"]["periodSeconds"] == 3 and "livenessProbe" not in agent
    for c in one(objs, "DaemonSet", "gpufrac-mps")["spec"]["template"]["spec"]["containers"]:
        assert c["securityContext"]["readOnlyRootFilesystem"] is True and c["securityContext"]["privileged"] is True
        assert c["readinessProbe"] == {"tcpSocket": {"port": 1}, "periodSeconds": 5, "failureThreshold": 3}


@pytest.mark.parametrize(("seconds", "ok"), [(30, True), (31, False)])
def test_webhook_timeouts_reach_30_seconds(seconds: int, ok: bool) -> None:
    done = helm("template", "gpufrac", str(CHART), "-n", NS, "--set", f"webhook.validating.timeoutSeconds={seconds}",
                check=False)
    assert (done.returncode == 0) is ok, done.stderr


def hook(objs: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    job = one(objs, "Job", "gpufrac-agent-withdraw")
    role = one(objs, "Role", "gpufrac-agent-withdraw")
    return container(job)["args"], role["rules"]


def test_the_uninstall_hook_deletes_the_self_managed_ca_secret_unless_kept() -> None:
    args, rules = hook(render())
    assert arg_value(args, "--delete-secret") == ["gpufrac-webhook-tls"]
    assert {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["gpufrac-webhook-tls"],
            "verbs": ["delete"]} in rules
    for values in (["--set", "certs.keepOnUninstall=true"], ["--set", "certs.mode=cert-manager"]):
        args, rules = hook(render(*values, "--api-versions", "cert-manager.io/v1/Certificate"))
        assert "--delete-secret" not in args, values
        assert not [r for r in rules if "secrets" in r["resources"]], values


def test_the_monitors_take_honor_labels_relabelings_and_metric_relabelings() -> None:
    objs = render(*MONITORING)
    sm, pm = one(objs, "ServiceMonitor"), one(objs, "PodMonitor")
    assert sm["spec"]["endpoints"][0]["honorLabels"] is False and "metricRelabelings" not in sm["spec"]["endpoints"][0]
    assert pm["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True
    objs = render(*MONITORING, "--set", "monitoring.serviceMonitor.honorLabels=true",
                  "--set", "monitoring.serviceMonitor.interval=15s",
                  "--set", "monitoring.podMonitor.relabelings[0].targetLabel=cluster",
                  "--set", "monitoring.podMonitor.relabelings[0].replacement=east",
                  "--set", "monitoring.serviceMonitor.metricRelabelings[0].action=drop",
                  "--set", "monitoring.serviceMonitor.metricRelabelings[0].regex=x",
                  "--set", "monitoring.dashboard.namespace=grafana")
    endpoint = one(objs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["honorLabels"] is True and endpoint["interval"] == "15s"
    assert endpoint["metricRelabelings"] == [{"action": "drop", "regex": "x"}]
    relabelings = one(objs, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert relabelings[0]["targetLabel"] == "node" and relabelings[1] == {"targetLabel": "cluster",
                                                                           "replacement": "east"}
    (dashboard,) = [o for o in find(objs, "ConfigMap") if o["metadata"]["name"] == "gpufrac-dashboard"]
    assert dashboard["metadata"]["namespace"] == "grafana"
