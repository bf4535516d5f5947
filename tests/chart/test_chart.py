"""The Helm chart (charts/gpufrac): lint, schema, Kubernetes 1.36 object schemas, and what each object must
say.

Needs the helm binary from `make tools` ($GPUFRAC_TOOLS_CACHE/bin/helm); skipped without it.
"""

from __future__ import annotations

import argparse
import copy
import re
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpufrac.agent.programs.withdraw import add_arguments as add_withdraw_arguments
from gpufrac.certs.rotation import add_rotate_arguments
from gpufrac.core import annotations as ann
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import DEFAULT_MPS_ROOT, DEFAULT_SCHEDULER_USER, FRACTIONAL_LABEL, mps_pipe_dir
from gpufrac.webhook.decide.policy import Policy
from gpufrac.webhook.decide.workloads import WORKLOADS
from testkit import cel, pods
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
    pod_policies,
    render,
    validating,
    workloads,
)

URL = "https://127.0.0.1:18443"
CA_BUNDLE = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="

pytestmark = needs_helm

FRACTION_KEYS = list(ann.SHORTHAND_KEYS)
PREFIXES = [ann.NVIDIA_PREFIX, ann.KAI_PREFIX, ann.GPUFRAC_DOMAIN]
URL_MODE = ["--set", f"webhook.clientConfig.url={URL}", "--set", f"webhook.clientConfig.caBundle={CA_BUNDLE}"]


def certificate_jobs(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Jobs and CronJob of the self-managed certificates (not the uninstall hook's Job)."""
    return [o for o in objs if o["kind"] in ("Job", "CronJob")
            and o["metadata"]["labels"]["app.kubernetes.io/component"] == "certs"]



@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return render()


# --- lint, schema, Kubernetes object schemas -------------------------------------------------------------


@pytest.mark.parametrize("mode", [[], CERT_MANAGER, URL_MODE], ids=["self-managed", "cert-manager", "url"])
def test_lint_strict(mode: list[str]) -> None:
    r = helm("lint", "--strict", str(CHART), "--namespace", NS, *mode, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize(
    "bad",
    [
        "webhook.replicas=two",
        "webhook.failurePolicy=Maybe",
        "webhook.mutating.timeoutSeconds=31",
        "webhook.validating.timeoutSeconds=0",
        "certs.mode=helm",
        "webhook.clientConfig.url=http://127.0.0.1:18443",
        "webhook.requireEnforcingNode=maybe",
        "webhook.allowMultipleFractionContainers=sometimes",
        "agent.metricsPort=99999",
        "webhook.notAKey=1",
    ],
)
def test_schema_rejects_wrong_values(bad: str) -> None:
    r = helm("template", "gpufrac", str(CHART), "--namespace", NS, "--set", bad, check=False)
    assert r.returncode != 0, f"--set {bad} rendered"
    assert "schema" in r.stderr or "values don't meet" in r.stderr, r.stderr


def test_the_mps_pipe_directories_come_from_one_value() -> None:
    """The webhook mounts and injects the directories the agent serves: both derive them from mps.root."""
    objs = render("--set", "mps.root=/srv/mps/")
    webhook_root = arg_value(container(one(objs, "Deployment"))["args"], "--mps-root")
    assert webhook_root == ["/srv/mps/"]
    agent = one(objs, "DaemonSet", "gpufrac-agent")
    assert arg_value(container(agent)["args"], "--mps-root") == ["/srv/mps/"]
    served = {mps_pipe_dir("/srv/mps/", mode) for mode in ComputeMode}
    host_paths = {v["hostPath"]["path"] for v in agent["spec"]["template"]["spec"]["volumes"] if "hostPath" in v}
    assert served <= host_paths
    assert set(Policy(mps_root=webhook_root[0]).mps_dirs.values()) == served
    r = helm("template", "gpufrac", str(CHART), "--namespace", NS, "--set", "mps.hostDirs.smSharing=/elsewhere",
             check=False)
    assert r.returncode != 0, "the former per-mode values are gone"


def test_kubernetes_older_than_1_30_is_refused() -> None:
    result = helm("template", "gpufrac", str(CHART), "--namespace", NS, "--kube-version", "1.29.0", check=False)
    assert result.returncode != 0 and "kubeVersion" in result.stderr
    assert helm("template", "gpufrac", str(CHART), "--namespace", NS, "--kube-version", "1.30.0").returncode == 0


@pytest.mark.parametrize("mode", [[], CERT_MANAGER, URL_MODE], ids=["self-managed", "cert-manager", "url"])
def test_every_object_passes_kubernetes_schema(mode: list[str]) -> None:
    objs = render(*mode)
    assert len(objs) > 10
    for obj in objs:
        if obj["apiVersion"].startswith("cert-manager.io/"):
            continue  # CRDs: checked in test_cert_manager_mode
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpufrac"
        if obj["kind"] not in {"ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                               "ValidatingWebhookConfiguration", "CSIDriver", "ValidatingAdmissionPolicy",
                               "ValidatingAdmissionPolicyBinding"}:
            assert obj["metadata"]["namespace"] == NS, obj["metadata"]["name"]


# --- webhook configurations -----------------------------------------------------------------------------


def test_webhook_configuration_defaults(default: list[dict[str, Any]]) -> None:
    m, v = mutating(default), validating(default)
    assert m["name"] == "mutate.gpufrac.io" and v["name"] == "validate.gpufrac.io"
    for w in (m, v):
        assert w["failurePolicy"] == "Fail"
        assert w["timeoutSeconds"] <= 5
        assert w["sideEffects"] == "None"
        assert w["admissionReviewVersions"] == ["v1"]
    assert m["timeoutSeconds"] == 3 and v["timeoutSeconds"] == 5
    assert m["reinvocationPolicy"] == "IfNeeded"
    (mr,) = m["rules"]
    assert sorted(mr["operations"]) == ["CREATE", "UPDATE"] and mr["resources"] == ["pods", "pods/ephemeralcontainers"]
    assert mr["apiGroups"] == [""] and mr["apiVersions"] == ["v1"]
    # A pod's CREATE is judged whole by the mutating webhook (it fails closed); pods/status is left to the
    # ValidatingAdmissionPolicies (policies.enabled, on by default): tests/chart/test_policies.py
    assert validating_rules(v) == {"CREATE": ["pods/binding"], "UPDATE": ["pods", "pods/ephemeralcontainers"]}


def validating_rules(webhook: dict[str, Any]) -> dict[str, list[str]]:
    """operation -> the pod resources a webhook is called for."""
    out: dict[str, list[str]] = {}
    for rule in webhook["rules"]:
        assert rule["apiGroups"] == [""] and rule["apiVersions"] == ["v1"]
        for operation in rule["operations"]:
            out[operation] = sorted(out.get(operation, []) + rule["resources"])
    return out


@pytest.mark.parametrize(("values", "webhook_creates", "policy_creates"), [
    ((), False, False),
    (("webhook.failurePolicy=Ignore",), True, True),
    (("webhook.mutating.failurePolicy=Ignore",), True, True),
    (("webhook.mutating.reinvocationPolicy=Never",), True, True),
    (("policies.enabled=false",), True, None),
], ids=["defaults", "fail-open", "mutating-fails-open", "no-reinvocation", "no-policies"])
def test_a_pods_create_is_judged_again_only_where_the_mutating_webhook_may_not_have_judged_it(
        values: tuple[str, ...], webhook_creates: bool, policy_creates: bool | None) -> None:
    """The lighter CREATE path: the mutating webhook runs every validating rule on the pod as it will be stored, so
    where it fails closed and is called again after any later mutation, the validating webhook and the pods policy
    leave a pod's CREATE to it; anywhere else they keep judging it."""
    objs = render(*(arg for value in values for arg in ("--set", value)))
    creates = validating_rules(validating(objs))["CREATE"]
    assert ("pods" in creates) is webhook_creates and "pods/binding" in creates
    policies = {p["metadata"]["name"]: p for p in pod_policies(objs)}
    if policy_creates is None:
        assert not policies
        return
    [operations] = [r["operations"] for r in policies["gpufrac-pods"]["spec"]["matchConstraints"]["resourceRules"]]
    assert ("CREATE" in operations) is policy_creates and "UPDATE" in operations


def test_failure_policy_is_configurable() -> None:
    objs = render("--set", "webhook.failurePolicy=Ignore")
    assert mutating(objs)["failurePolicy"] == "Ignore" and validating(objs)["failurePolicy"] == "Ignore"
    objs = render("--set", "webhook.mutating.failurePolicy=Ignore")
    assert mutating(objs)["failurePolicy"] == "Ignore" and validating(objs)["failurePolicy"] == "Fail"
    assert workloads(objs)["failurePolicy"] == "Fail"
    objs = render("--set", "webhook.validating.timeoutSeconds=2")
    assert validating(objs)["timeoutSeconds"] == 2 and workloads(objs)["timeoutSeconds"] == 2


@pytest.mark.parametrize("namespace", [NS, "gpu-admission"])
def test_namespace_selector_excludes_system_and_release_namespace(namespace: str) -> None:
    objs = render("--set", "webhook.excludedNamespaces={monitoring}", namespace=namespace)
    for w in (mutating(objs), validating(objs), workloads(objs)):
        (expr,) = w["namespaceSelector"]["matchExpressions"]
        assert expr["key"] == "kubernetes.io/metadata.name" and expr["operator"] == "NotIn"
        assert set(expr["values"]) == {"kube-system", namespace, "monitoring"}
        assert "objectSelector" not in w


def test_service_mode_client_config(default: list[dict[str, Any]]) -> None:
    svc = one(default, "Service", "gpufrac-webhook")
    dep = one(default, "Deployment")
    for w, path in ((mutating(default), "/mutate"), (validating(default), "/validate"),
                    (workloads(default), "/validate")):
        cc = w["clientConfig"]
        assert "url" not in cc
        assert cc["service"] == {"name": svc["metadata"]["name"], "namespace": NS, "path": path, "port": 443}
        # Filled by the rotation job (lookup finds no Secret under `helm template`).
        assert "caBundle" not in cc
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    https, metrics = svc["spec"]["ports"]
    assert https["port"] == 443 and https["targetPort"] == "https"
    assert (metrics["name"], metrics["port"], metrics["targetPort"]) == ("metrics", 9476, "metrics")
    assert container(dep)["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"},
                                       {"name": "metrics", "containerPort": 9476, "protocol": "TCP"}]


def test_url_mode_switches_client_config() -> None:
    objs = render(*URL_MODE)
    for w, path in ((mutating(objs), "/mutate"), (validating(objs), "/validate"), (workloads(objs), "/validate")):
        assert w["clientConfig"] == {"url": URL + path, "caBundle": CA_BUNDLE}
    # The harness's certificates are not the chart's to manage.
    assert not certificate_jobs(objs) and not find(objs, "Certificate")
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert "annotations" not in one(objs, kind)["metadata"]
    # A trailing slash on the URL does not double up; cert-manager mode does not inject into url configs.
    objs = render("--set", f"webhook.clientConfig.url={URL}/", *CERT_MANAGER)
    assert mutating(objs)["clientConfig"] == {"url": URL + "/mutate"}
    assert "annotations" not in one(objs, "MutatingWebhookConfiguration")["metadata"]


def test_url_mode_show_only_command_of_the_e2e_harness() -> None:
    out = helm(
        "template", "gpufrac", str(CHART), "--namespace", NS, *URL_MODE,
        "--show-only", "templates/webhook/mutatingwebhookconfiguration.yaml",
        "--show-only", "templates/webhook/validatingwebhookconfiguration.yaml",
    ).stdout
    objs = [o for o in yaml.safe_load_all(out) if o]
    assert [o["kind"] for o in objs] == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    for o in objs:
        kubernetes_validate.validate(o, K8S_VERSION, strict=True)


# --- matchConditions ---------------------------------------------------------------------------------------


def test_match_conditions_name_every_fraction_key(default: list[dict[str, Any]]) -> None:
    for w in (mutating(default), validating(default)):
        cond = w["matchConditions"][0]
        expr = cond["expression"]
        for key in FRACTION_KEYS:
            assert f'"{key}"' in expr
        for prefix in PREFIXES:
            assert f'k.startsWith("{prefix}")' in expr
        assert f'"{FRACTIONAL_LABEL}" in object.metadata.labels' in expr
        # Guards: absent maps, and no oldObject on CREATE.
        assert "has(object.metadata.annotations)" in expr and "has(object.metadata.labels)" in expr
        assert "oldObject != null &&" in expr and "has(oldObject.metadata.annotations)" in expr
        assert expr.count("(") == expr.count(")")


def test_all_bindings_option_sends_every_bind_to_the_validating_webhook(default: list[dict[str, Any]]) -> None:
    guard = '(has(request.subResource) && request.subResource == "binding")'
    for w in (mutating(default), validating(default)):
        assert "request." not in w["matchConditions"][0]["expression"]
    objs = render("--set", "webhook.validating.allBindings=true")
    expr = validating(objs)["matchConditions"][0]["expression"]
    # Guarded: request.subResource is absent on plain pod requests, and a CEL error would mean failurePolicy.
    assert expr.startswith(guard + "\n|| (has(object.metadata.annotations)")
    assert "request." not in mutating(objs)["matchConditions"][0]["expression"]


def test_extra_match_conditions_are_appended() -> None:
    expr = "!('system:nodes' in request.userInfo.groups)"
    objs = render("--set", "webhook.extraMatchConditions[0].name=no-kubelet",
                  "--set", f"webhook.extraMatchConditions[0].expression={expr}")
    assert [c["name"] for c in mutating(objs)["matchConditions"]] == ["has-fraction-keys", "changes-fraction-keys",
                                                                       "no-kubelet"]


def pod(annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod whose metadata has no annotations at all when `annotations` is None (the CEL must guard that)."""
    obj = pods.pod(annotations, namespace="default", labels=labels)
    if annotations is None:
        del obj["metadata"]["annotations"]
    return obj


@pytest.mark.parametrize(
    ("obj", "old", "expected"),
    [
        (pod(), None, False),
        (pod({}), None, False),
        (pod({"example.com/x": "1"}, {"app": "x"}), None, False),
        (pod({"gpu-fraction": "0.5"}), None, True),
        (pod({"gpu-memory": "1024"}), None, True),
        (pod({"gpu-fraction-container-name": "app"}), None, True),
        (pod({"gpu-fraction-num-devices": "2"}), None, True),
        (pod({"gpu-fraction.limit": "0.7"}), None, True),
        (pod({"gpu-memory.limit": "2048"}), None, True),
        (pod({"gpu-fractionx": "0.5"}), None, False),
        (pod({"nvidia.com/container.app.gpu-memory.request": "40Gi"}), None, True),
        (pod({"nvidia.com/gpu.present": "true"}), None, False),
        (pod({"kai.scheduler/container.app.gpu-memory.portion.limit": "0.6"}), None, True),
        (pod({"gpufrac.io/container.app.compute-mode": "sm-sharing"}), None, True),
        (pod(None, {"gpufrac.io/fractional": "true"}), None, True),
        # UPDATE that strips the keys is still checked (against oldObject).
        (pod({}), pod({"gpu-fraction": "0.5"}), True),
        (pod(), pod(None, {"gpufrac.io/fractional": "true"}), True),
        (pod({"a": "b"}), pod({"c": "d"}), False),
        # pods/binding: the object is a Binding; no labels.
        ({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"name": "n"}},
         None, False),
        ({"apiVersion": "v1", "kind": "Binding",
          "metadata": {"name": "p", "annotations": {"nvidia.com/container.app.gpus.devices": "GPU-1"}},
          "target": {"name": "n"}}, None, True),
    ],
)
def test_match_conditions_logic(
    default: list[dict[str, Any]], obj: dict[str, Any], old: dict[str, Any] | None, expected: bool
) -> None:
    for w in (mutating(default), validating(default)):
        # The first condition; the validating webhook's second one leaves a pod's CREATE to the policies
        # (tests/chart/test_policies.py).
        cond = w["matchConditions"][0]
        assert cond["name"] == "has-fraction-keys"
        assert cel.condition(cond["expression"], obj, old) is expected


FRACTIONAL = pod({"gpu-fraction": "0.5", "gpufrac.io/container.app.gpu-memory.limit-mib": "4096"},
                 {"gpufrac.io/fractional": "true", "app": "a"})


def changed(annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
            drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """FRACTIONAL with some annotations or labels set (None as a value removes it) and `drop` keys removed."""
    obj = copy.deepcopy(FRACTIONAL)
    for key, value in (annotations or {}).items():
        obj["metadata"]["annotations"][key] = value
    for key, value in (labels or {}).items():
        obj["metadata"]["labels"][key] = value
    for key in drop:
        obj["metadata"]["annotations"].pop(key, None)
        obj["metadata"]["labels"].pop(key, None)
    return obj


@pytest.mark.parametrize(("operation", "sub", "obj", "old", "judged"), [
    ("CREATE", None, FRACTIONAL, None, True),
    ("UPDATE", None, FRACTIONAL, FRACTIONAL, False),  # a controller's UPDATE that touches nothing of gpufrac's
    ("UPDATE", None, changed({"example.com/owner": "x"}, {"tier": "gold"}), FRACTIONAL, False),
    ("UPDATE", None, pod({"a": "b"}), pod({"a": "c"}), False),  # a plain pod's
    ("UPDATE", None, changed({"nvidia.com/container.app.gpus.devices": "GPU-1"}), FRACTIONAL, True),  # the bind
    ("UPDATE", None, changed({"gpu-fraction": "0.6"}), FRACTIONAL, True),
    ("UPDATE", None, changed(drop=("gpufrac.io/container.app.gpu-memory.limit-mib",)), FRACTIONAL, True),
    ("UPDATE", None, changed(drop=("gpufrac.io/fractional",)), FRACTIONAL, True),
    ("UPDATE", None, changed(labels={"gpufrac.io/fractional": "false"}), FRACTIONAL, True),
    ("UPDATE", None, pod({"a": "b"}, {"gpufrac.io/fractional": "true"}), pod({"a": "b"}), True),
    ("UPDATE", None, pod({"gpu-memory": "1024"}), pod(None), True),  # a plain pod made fractional
    ("UPDATE", "status", FRACTIONAL, FRACTIONAL, False),  # the kubelet's status writes
    ("UPDATE", "status", changed({"gpu-fraction": "0.9"}), FRACTIONAL, True),
    ("UPDATE", "ephemeralcontainers", FRACTIONAL, FRACTIONAL, True),  # `kubectl debug`: always judged
], ids=["create", "unchanged", "other-keys", "plain", "bind", "key-changed", "key-removed", "label-removed",
        "label-changed", "label-added", "keys-added", "status", "status-key-changed", "ephemeral"])
def test_an_update_is_judged_only_when_it_changes_a_fraction_key_or_the_label(
        default: list[dict[str, Any]], operation: str, sub: str | None, obj: dict[str, Any],
        old: dict[str, Any] | None, judged: bool) -> None:
    request = {"operation": operation, "userInfo": {"username": "alice"}, **({"subResource": sub} if sub else {})}
    gated = [mutating(default), validating(default), *(p["spec"] for p in pod_policies(default))]
    for gate in gated:
        [condition] = [c for c in gate["matchConditions"] if c["name"] == "changes-fraction-keys"]
        assert bool(cel.evaluate(condition["expression"], object=obj, oldObject=old, request=request)) is judged


def test_workload_templates_go_to_their_own_validating_webhook(default: list[dict[str, Any]]) -> None:
    w = workloads(default)
    resources = {(g, r) for rule in w["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert resources == {(gw.group, gw.resource) for gw in WORKLOADS}
    for rule in w["rules"]:
        assert sorted(rule["operations"]) == ["CREATE", "UPDATE"] and rule["apiVersions"] == ["v1"]
    assert w["sideEffects"] == "None" and w["admissionReviewVersions"] == ["v1"]
    # Never mutated: no mutating webhook sees workloads.
    assert mutating(default)["rules"][0]["resources"] == ["pods", "pods/ephemeralcontainers"]
    expr = w["matchConditions"][0]["expression"]
    for key in FRACTION_KEYS:
        assert f'"{key}"' in expr
    assert expr.count("(") == expr.count(")")


def workload_obj(kind: str, annotations: dict[str, str] | None, metadata: bool = True) -> dict[str, Any]:
    """A workload whose template has no annotations (None), or no metadata at all (metadata=False)."""
    obj = pods.workload(kind, annotations)
    template = pods.pod_template(obj)
    if not metadata:
        del template["metadata"]
    elif annotations is None:
        del template["metadata"]["annotations"]
    return obj


@pytest.mark.parametrize("kind", [w.kind for w in WORKLOADS])
@pytest.mark.parametrize(("annotations", "metadata", "expected"), [
    ({"gpu-fraction": "0.5"}, True, True),
    ({"kai.scheduler/gpu-compute-sharing-mode": "sm-sharing"}, True, True),
    ({"nvidia.com/container.app.gpu-memory.request": "1Gi"}, True, True),
    ({"kai.scheduler/container.app.gpu-memory.portion.limit": "0.6"}, True, True),
    ({"prometheus.io/scrape": "true"}, True, False),
    (None, True, False),
    (None, False, False),  # a template without metadata: guarded, not a CEL error
])
def test_workload_match_conditions_send_only_templates_with_fractions(
    default: list[dict[str, Any]], kind: str, annotations: dict[str, str] | None, metadata: bool, expected: bool
) -> None:
    expr = workloads(default)["matchConditions"][0]["expression"]
    assert cel.condition(expr, workload_obj(kind, annotations, metadata), None) is expected


# --- webhook Deployment -------------------------------------------------------------------------------------


def test_webhook_deployment_availability(default: list[dict[str, Any]]) -> None:
    dep = one(default, "Deployment", "gpufrac-webhook")
    spec = dep["spec"]
    pod_labels = spec["template"]["metadata"]["labels"]
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pdb = one(default, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    anti = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    hard = one(render("--set", "webhook.podAntiAffinity=hard"), "Deployment")
    hard_anti = hard["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert hard_anti["requiredDuringSchedulingIgnoredDuringExecution"]
    assert not find(render("--set", "webhook.podDisruptionBudget.enabled=false"), "PodDisruptionBudget")
    assert one(render("--set", "webhook.replicas=3"), "Deployment")["spec"]["replicas"] == 3


def test_webhook_container(default: list[dict[str, Any]]) -> None:
    dep = one(default, "Deployment", "gpufrac-webhook")
    pod_spec = dep["spec"]["template"]["spec"]
    c = container(dep)
    assert c["command"] == ["gpufrac"]
    args = c["args"]
    assert args[0] == "webhook"
    assert arg_value(args, "--certs") == ["/certs"] and arg_value(args, "--bind") == [":8443"]
    assert arg_value(args, "--metrics-bind") == [":9476"]
    assert arg_value(args, "--scheduler-user") == [DEFAULT_SCHEDULER_USER]
    assert arg_value(args, "--scheduler-group") == []
    assert arg_value(args, "--mps-root") == [DEFAULT_MPS_ROOT]
    assert "--require-enforcing-node" in args and "--no-require-enforcing-node" not in args
    # KAI's binder binds one fraction container per pod: several are denied unless a binder binds each.
    assert "--no-allow-multiple-fraction-containers" in args and "--allow-multiple-fraction-containers" not in args
    assert arg_value(args, "--workers") == ["2"] and arg_value(args, "--threads") == ["4"]
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = c[probe]["httpGet"]
        assert get["path"] == path and get["scheme"] == "HTTPS" and get["port"] == "https"
    assert c["lifecycle"]["preStop"]["sleep"]["seconds"] > 0
    assert pod_spec["terminationGracePeriodSeconds"] > c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod_spec["securityContext"]["runAsNonRoot"] is True
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/certs"]
    assert "subPath" not in mount  # kubelet updates whole-Secret mounts on rotation
    (vol,) = [v for v in pod_spec["volumes"] if v["name"] == mount["name"]]
    assert vol["secret"]["secretName"] == "gpufrac-webhook-tls"
    assert {i["key"] for i in vol["secret"]["items"]} == {"tls.crt", "tls.key", "ca.crt"}  # not ca.key
    sa = one(default, "ServiceAccount", "gpufrac-webhook")
    assert pod_spec["serviceAccountName"] == sa["metadata"]["name"]


def test_webhook_args_follow_values() -> None:
    objs = render("--set", "webhook.requireEnforcingNode=false",
                  "--set", "webhook.allowMultipleFractionContainers=true",
                  "--set", "webhook.schedulerUsers={u1,u2}", "--set", "webhook.schedulerGroups={g1}",
                  "--set", "webhook.workers=3", "--set", "webhook.threads=8",
                  "--set", "mps.root=/srv/mps")
    args = container(one(objs, "Deployment"))["args"]
    assert "--no-require-enforcing-node" in args and "--require-enforcing-node" not in args
    assert "--allow-multiple-fraction-containers" in args and "--no-allow-multiple-fraction-containers" not in args
    assert arg_value(args, "--scheduler-user") == ["u1", "u2"]
    assert arg_value(args, "--scheduler-group") == ["g1"]
    assert arg_value(args, "--workers") == ["3"] and arg_value(args, "--threads") == ["8"]
    assert arg_value(args, "--mps-root") == ["/srv/mps"]
    agent_args = container(one(objs, "DaemonSet", "gpufrac-agent"))["args"]
    assert arg_value(agent_args, "--mps-root") == ["/srv/mps"]


def test_image_defaults_and_overrides(default: list[dict[str, Any]]) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert container(one(default, "Deployment"))["image"] == f"ghcr.io/gpufrac/gpufrac:{chart['appVersion']}"
    objs = render("--set", "image.tag=v9", "--set", "agent.image.repository=example.com/agent",
                  "--set", "webhook.image.digest=sha256:" + "a" * 64)
    assert container(one(objs, "DaemonSet", "gpufrac-agent"))["image"] == "example.com/agent:v9"
    assert container(one(objs, "Deployment"))["image"] == "ghcr.io/gpufrac/gpufrac@sha256:" + "a" * 64


# --- agent --------------------------------------------------------------------------------------------------


def test_agent_daemonset(default: list[dict[str, Any]]) -> None:
    ds = one(default, "DaemonSet", "gpufrac-agent")
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    assert spec["priorityClassName"] == "system-node-critical"
    c = container(ds)
    assert c["securityContext"]["privileged"] is True
    assert c["args"][:3] == ["agent", "--node", "$(NODE_NAME)"]
    assert arg_value(c["args"], "--metrics-bind") == [":9475"]
    assert arg_value(c["args"], "--mps-root") == [DEFAULT_MPS_ROOT]
    (node_env,) = [e for e in c["env"] if e["name"] == "NODE_NAME"]
    assert node_env["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert {"name": "metrics", "containerPort": 9475, "protocol": "TCP"} in c["ports"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    host_paths = {v["hostPath"]["path"]: v["hostPath"]["type"] for v in spec["volumes"] if "hostPath" in v}
    assert host_paths == {
        **{mps_pipe_dir(DEFAULT_MPS_ROOT, mode): "DirectoryOrCreate" for mode in ComputeMode},
        "/run/gpufrac/mps/shm": "DirectoryOrCreate",
        "/var/log/gpufrac/mps": "DirectoryOrCreate",
        "/var/lib/kubelet/plugins/mps.gpufrac.io": "DirectoryOrCreate",
        "/var/lib/kubelet/plugins_registry": "Directory",
        "/var/lib/kubelet/pods": "Directory",
        "/var/lib/kubelet/device-plugins": "Directory",
        "/var/run/nri": "DirectoryOrCreate",
        "/run/gpufrac/nri": "DirectoryOrCreate",
        "/etc/cdi": "DirectoryOrCreate",
        "/var/run/cdi": "DirectoryOrCreate",
    }
    assert {m["mountPath"] for m in c["volumeMounts"]} == set(host_paths)
    (pods,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/var/lib/kubelet/pods"]
    assert pods["mountPropagation"] == "Bidirectional", "the plugin's mounts must reach the kubelet"
    assert "--csi" in c["args"]
    assert arg_value(c["args"], "--csi-driver") == ["mps.gpufrac.io"]
    assert arg_value(c["args"], "--kubelet-dir") == ["/var/lib/kubelet"]
    assert arg_value(c["args"], "--ready-condition-type") == ["gpu-sharing.nvidia.com/Ready",
                                                               "gpu-fractioning.nvidia.com/Ready"]
    assert not find(render("--set", "agent.enabled=false"), "DaemonSet")


def test_csi_delivery_installs_the_csidriver_and_the_webhook_names_it(default: list[dict[str, Any]]) -> None:
    driver = one(default, "CSIDriver", "mps.gpufrac.io")
    assert driver["spec"] == {"attachRequired": False, "podInfoOnMount": True, "volumeLifecycleModes": ["Ephemeral"],
                              "fsGroupPolicy": "None", "requiresRepublish": False, "storageCapacity": False}
    args = one(default, "Deployment", "gpufrac-webhook")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert arg_value(args, "--delivery") == ["csi"]
    assert arg_value(args, "--csi-driver") == ["mps.gpufrac.io"]


def test_the_mps_daemons_run_in_their_own_daemonset_that_upgrades_do_not_roll(default: list[dict[str, Any]]) -> None:
    ds = one(default, "DaemonSet", "gpufrac-mps")
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    spec = ds["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert [c["name"] for c in spec["containers"]] == ["time-slicing", "sm-sharing"]
    for c in spec["containers"]:
        assert c["args"][:3] == ["mps", "--mode", c["name"]]
        assert arg_value(c["args"], "--mps-root") == ["/run/gpufrac/mps"]
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert mounts[f"/run/gpufrac/mps/{c['name']}"] == f"pipe-{c['name']}"
        assert mounts["/dev/shm"] == "mps-shm", "clients get the same directory at /dev/shm"
        assert c["resources"]["limits"]["memory"] == "640Mi"
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host_paths == {"/run/gpufrac/mps/time-slicing", "/run/gpufrac/mps/sm-sharing", "/run/gpufrac/mps/shm",
                          "/var/log/gpufrac/mps"}
    agent = container(one(default, "DaemonSet", "gpufrac-agent"))
    assert arg_value(agent["args"], "--mps-daemons") == ["external"], "the agent only watches them"
    own = render("--set", "mps.daemonSet.enabled=false")
    assert not find(own, "DaemonSet", "gpufrac-mps")
    assert "--mps-daemons" not in container(one(own, "DaemonSet", "gpufrac-agent"))["args"]


def test_hostpath_delivery_has_no_csi_driver_and_no_kubelet_mounts() -> None:
    objs = render("--set", "mps.delivery=hostPath")
    assert not find(objs, "CSIDriver")
    c = container(one(objs, "DaemonSet", "gpufrac-agent"))
    assert "--csi" not in c["args"]
    kubelet_mounts = [m["mountPath"] for m in c["volumeMounts"] if m["mountPath"].startswith("/var/lib/kubelet")]
    assert kubelet_mounts == ["/var/lib/kubelet/device-plugins"], "only the NRI plugin's read of the device checkpoint"
    args = one(objs, "Deployment", "gpufrac-webhook")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert arg_value(args, "--delivery") == ["hostPath"]
    failed = helm("template", "g", str(CHART), "--set", "mps.delivery=volume", check=False)
    assert failed.returncode != 0 and "delivery" in failed.stderr


def test_the_nri_plugin_follows_its_values(default: list[dict[str, Any]]) -> None:
    c = container(one(default, "DaemonSet", "gpufrac-agent"))
    assert "--nri" in c["args"] and "--nri-void-env-grants" in c["args"]
    assert arg_value(c["args"], "--nri-socket") == ["/var/run/nri/nri.sock"]
    assert arg_value(c["args"], "--nri-index") == ["10"]
    assert arg_value(c["args"], "--nri-lock-file") == ["/run/gpufrac/nri/plugin.lock"]
    assert arg_value(c["args"], "--nri-trusted-namespace") == ["kube-system", "nvidia-device-plugin", "gpu-operator",
                                                                 "nvidia-gpu-operator"]
    assert arg_value(c["args"], "--cdi-spec-dir") == ["/etc/cdi", "/var/run/cdi"]
    assert {m["mountPath"]: m.get("readOnly", False) for m in c["volumeMounts"]
            if "cdi" in m["name"]} == {"/etc/cdi": True, "/var/run/cdi": True}
    annotations = one(default, "DaemonSet", "gpufrac-agent")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["gpufrac.io/tolerate-missing-nri-plugin"] == "true", "it starts while its own plugin is away"

    objs = render("--set", "nri.socketPath=/run/k3s/nri/nri.sock", "--set", "nri.voidEnvGrants=false",
                  "--set-json", "nri.trustedNamespaces=[]", "--set", "nri.cdiSpecDirs={/opt/cdi}")
    c = container(one(objs, "DaemonSet", "gpufrac-agent"))
    assert arg_value(c["args"], "--nri-socket") == ["/run/k3s/nri/nri.sock"]
    assert "--no-nri-void-env-grants" in c["args"]
    assert arg_value(c["args"], "--nri-trusted-namespace") == [""]
    spec = one(objs, "DaemonSet", "gpufrac-agent")["spec"]["template"]["spec"]
    paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert {"/run/k3s/nri", "/opt/cdi"} <= paths and "/var/run/nri" not in paths

    off = container(one(render("--set", "nri.enabled=false"), "DaemonSet", "gpufrac-agent"))
    assert not [a for a in off["args"] if a.startswith(("--nri", "--cdi"))]
    assert not [m for m in off["volumeMounts"] if m["name"].startswith(("nri", "cdi"))]
    failed = helm("template", "g", str(CHART), "--set", "nri.index=7", check=False)
    assert failed.returncode != 0 and "index" in failed.stderr


def test_ready_condition_types_are_configurable() -> None:
    c = container(one(render("--set", "agent.readyConditionTypes={gpu-fractioning.nvidia.com/Ready}"),
                      "DaemonSet", "gpufrac-agent"))
    assert arg_value(c["args"], "--ready-condition-type") == ["gpu-fractioning.nvidia.com/Ready"]
    c = container(one(render("--set", "agent.readyConditionTypes=null"), "DaemonSet", "gpufrac-agent"))
    assert arg_value(c["args"], "--ready-condition-type") == [""]


def _rules(role: dict[str, Any]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    return {
        (g, r, v, tuple(rule.get("resourceNames", ())))
        for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }


def test_agent_rbac(default: list[dict[str, Any]]) -> None:
    rules = _rules(one(default, "ClusterRole", "gpufrac-agent"))
    for verb in ("get", "list", "watch"):
        assert ("", "pods", verb, ()) in rules
    for res in ("nodes", "nodes/status"):
        assert ("", res, "get", ()) in rules and ("", res, "patch", ()) in rules
    assert ("", "nodes", "list", ()) in rules  # whether any node serves time-slicing (unplaceable fractions)
    assert ("", "events", "create", ()) in rules and ("", "events", "patch", ()) in rules
    assert ("", "pods/eviction", "create", ()) not in rules  # the defaults never evict
    assert not any(v in {"delete", "*", "update"} for _, _, v, _ in rules)
    binding = one(default, "ClusterRoleBinding", "gpufrac-agent")
    ds = one(default, "DaemonSet", "gpufrac-agent")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": ds["spec"]["template"]["spec"][
        "serviceAccountName"], "namespace": NS}]


@pytest.mark.parametrize("values", [("reclaim.policy=evict",), ("enforcement.overLimitAction=evict",),
                                    ("agent.extraArgs={--evict-on-violation}",)])
def test_the_agent_may_evict_only_where_it_can_evict(values: tuple[str, ...]) -> None:
    rules = _rules(one(render(*(a for v in values for a in ("--set", v))), "ClusterRole", "gpufrac-agent"))
    assert ("", "pods/eviction", "create", ()) in rules
    for other in ("reclaim.policy=off", "enforcement.overLimitAction=kill-newest"):
        rules = _rules(one(render("--set", other), "ClusterRole", "gpufrac-agent"))
        assert ("", "pods/eviction", "create", ()) not in rules


def test_guarantee_values_reach_the_agent(default: list[dict[str, Any]]) -> None:
    from gpufrac.agent.decide.overlimit import OverLimitAction
    from gpufrac.agent.decide.reclaim import ReclaimPolicy
    from gpufrac.agent.node.guarantee import GuaranteeConfig
    from gpufrac.agent.programs.node_agent import add_arguments, config_from_args

    def config(docs: list[dict[str, Any]]) -> GuaranteeConfig:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = [a.replace("$(NODE_NAME)", "n") for a in container(one(docs, "DaemonSet", "gpufrac-agent"))["args"]]
        return config_from_args(parser.parse_args(args[1:])).guarantee

    assert config(default).over_limit_action is OverLimitAction.EVENT
    assert config(default).reclaim.policy is ReclaimPolicy.OFF
    tuned = config(render("--set", "enforcement.overLimitAction=kill-newest", "--set", "reclaim.policy=evict",
                          "--set-json", "reclaim.gracePeriodSeconds=12.5", "--set", "reclaim.hysteresisMiB=64"))
    assert tuned.over_limit_action is OverLimitAction.KILL_NEWEST and tuned.reclaim.policy is ReclaimPolicy.EVICT
    assert (tuned.reclaim.grace_seconds, tuned.reclaim.hysteresis_bytes) == (12.5, 64 << 20)
    assert config(render("--set-json", "reclaim.policy=false")).reclaim.policy is ReclaimPolicy.OFF  # YAML's `off`
    failed = helm("template", "g", str(CHART), "--set", "reclaim.policy=always", check=False)
    assert failed.returncode != 0 and "reclaim" in failed.stderr


def test_the_hard_limit_choice_reaches_the_agent(default: list[dict[str, Any]]) -> None:
    from gpufrac.agent.decide.hard_limits import WithoutHardLimit
    from gpufrac.agent.programs.node_agent import add_arguments, config_from_args

    def choice(docs: list[dict[str, Any]]) -> WithoutHardLimit:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = [a.replace("$(NODE_NAME)", "n") for a in container(one(docs, "DaemonSet", "gpufrac-agent"))["args"]]
        return config_from_args(parser.parse_args(args[1:])).without_hard_limit

    assert choice(default) is WithoutHardLimit.REPORT
    assert choice(render("--set", "enforcement.withoutHardLimit=refuse")) is WithoutHardLimit.REFUSE
    failed = helm("template", "g", str(CHART), "--set", "enforcement.withoutHardLimit=maybe", check=False)
    assert failed.returncode != 0 and "withoutHardLimit" in failed.stderr


# --- the uninstall hook -------------------------------------------------------------------------------------

WITHDRAW = "gpufrac-agent-withdraw"
WITHDRAW_OBJECTS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "Job")


def _withdraw_args(job: dict[str, Any]) -> argparse.Namespace:
    c = container(job)
    assert c["command"] == ["gpufrac"] and c["args"][0] == "agent-withdraw"
    parser = argparse.ArgumentParser()
    add_withdraw_arguments(parser)
    return parser.parse_args(c["args"][1:])  # the chart's flags are the CLI's flags


def _selector(workload: dict[str, Any]) -> dict[str, str]:
    return workload["spec"]["selector"]["matchLabels"]


def _parse_selector(text: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in text.split(","))


def test_the_uninstall_hook_runs_only_before_a_delete_and_names_what_the_release_runs(
        default: list[dict[str, Any]]) -> None:
    job = one(default, "Job", WITHDRAW)
    for kind in WITHDRAW_OBJECTS:
        ann = one(default, kind, WITHDRAW)["metadata"]["annotations"]
        # Never on install, upgrade or rollback: an agent replaced by a rolling update keeps its labels.
        assert ann["helm.sh/hook"] == "pre-delete", kind
        assert ann["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        if kind != "Job":  # its ServiceAccount and RBAC exist before it
            assert int(ann["helm.sh/hook-weight"]) < int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
    args = _withdraw_args(job)
    agent, mps = one(default, "DaemonSet", "gpufrac-agent"), one(default, "DaemonSet", "gpufrac-mps")
    assert (args.namespace, args.agent_daemonset, args.mps_daemonset) == (NS, "gpufrac-agent", "gpufrac-mps")
    assert _parse_selector(args.agent_selector) == _selector(agent)
    assert _parse_selector(args.mps_selector) == _selector(mps)
    # The hook's own pod is not one of the pods it waits for.
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert not _selector(agent).items() <= pod_labels.items() and not _selector(mps).items() <= pod_labels.items()
    # It removes the condition types the agent publishes, and waits as long as an agent may take to stop.
    assert args.ready_condition_type == arg_value(container(agent)["args"], "--ready-condition-type")
    grace = agent["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace < args.timeout <= grace + 30
    assert job["spec"]["activeDeadlineSeconds"] >= 2 * args.timeout
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == WITHDRAW


def test_the_uninstall_hook_rbac_is_what_it_does(default: list[dict[str, Any]]) -> None:
    assert _rules(one(default, "Role", WITHDRAW)) == {
        ("apps", "daemonsets", "delete", ("gpufrac-agent", "gpufrac-mps")), ("", "pods", "list", ()),
        ("", "secrets", "delete", ("gpufrac-webhook-tls",))}
    assert _rules(one(default, "ClusterRole", WITHDRAW)) == {
        ("", "nodes", "list", ()), ("", "nodes", "patch", ()), ("", "nodes/status", "patch", ())}
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        binding = one(default, kind, WITHDRAW)
        assert binding["roleRef"]["name"] == WITHDRAW
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": WITHDRAW, "namespace": NS}]


def test_the_uninstall_hook_follows_the_values() -> None:
    objs = render("--set", "mps.daemonSet.enabled=false", "--set", "agent.readyConditionTypes=null",
                  "--set", "agent.terminationGracePeriodSeconds=200", "--set", "agent.image.tag=9.9")
    job = one(objs, "Job", WITHDRAW)
    args = _withdraw_args(job)
    assert args.mps_daemonset == "" and args.ready_condition_type == [""] and args.timeout == 215
    assert container(job)["image"] == "ghcr.io/gpufrac/gpufrac:9.9"
    assert _rules(one(objs, "Role", WITHDRAW)) == {("apps", "daemonsets", "delete", ("gpufrac-agent",)),
                                                   ("", "pods", "list", ()),
                                                   ("", "secrets", "delete", ("gpufrac-webhook-tls",))}
    objs = render("--set", "agent.readyConditionTypes={gpu-fractioning.nvidia.com/Ready}")
    assert _withdraw_args(one(objs, "Job", WITHDRAW)).ready_condition_type == ["gpu-fractioning.nvidia.com/Ready"]
    objs = render("--set", "fullnameOverride=gf")
    args = _withdraw_args(one(objs, "Job", "gf-agent-withdraw"))
    assert (args.agent_daemonset, args.mps_daemonset) == ("gf-agent", "gf-mps")
    assert _parse_selector(args.agent_selector) == _selector(one(objs, "DaemonSet", "gf-agent"))
    for off in ("agent.enabled=false", "agent.withdrawOnUninstall=false"):
        assert not [o for o in render("--set", off) if o["metadata"]["name"] == WITHDRAW], off


def test_the_uninstall_hook_runs_like_the_certificate_jobs(default: list[dict[str, Any]]) -> None:
    def pod(objs: list[dict[str, Any]], name: str) -> dict[str, Any]:
        return dict(one(objs, "Job", name)["spec"]["template"]["spec"])

    hook, certs = pod(default, WITHDRAW), pod(default, "gpufrac-certs-init")
    assert hook["securityContext"] == certs["securityContext"] and hook["securityContext"]["runAsNonRoot"] is True
    assert hook["containers"][0]["securityContext"] == certs["containers"][0]["securityContext"]
    assert hook["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert hook["containers"][0]["resources"] == certs["containers"][0]["resources"]
    assert hook["restartPolicy"] == "OnFailure"
    objs = render("--set", "certs.selfManaged.tolerations[0].operator=Exists",
                  "--set", "certs.selfManaged.priorityClassName=platform-critical",
                  "--set", "certs.selfManaged.nodeSelector.pool=system", "--set", "imagePullSecrets[0].name=reg")
    hook, certs = pod(objs, WITHDRAW), pod(objs, "gpufrac-certs-init")
    for key in ("tolerations", "priorityClassName", "nodeSelector", "imagePullSecrets"):
        assert hook[key] == certs[key], key
    assert hook["tolerations"] == [{"operator": "Exists"}] and hook["nodeSelector"]["pool"] == "system"


# --- certificates -------------------------------------------------------------------------------------------


def _rotate_args(workload: dict[str, Any]) -> argparse.Namespace:
    c = container(workload)
    assert c["command"] == ["gpufrac"] and c["args"][:2] == ["certs", "rotate"]
    parser = argparse.ArgumentParser()
    add_rotate_arguments(parser)
    return parser.parse_args(c["args"][2:])  # the chart's flags are the CLI's flags


def test_self_managed_certificates(default: list[dict[str, Any]]) -> None:
    assert len(certificate_jobs(default)) == 3
    jobs = {j["metadata"]["name"]: j for j in find(default, "Job")}
    init, sync = jobs["gpufrac-certs-init"], jobs["gpufrac-certs-sync"]
    assert init["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert sync["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    cron = one(default, "CronJob", "gpufrac-certs")
    assert re.fullmatch(r"\d+ \d+ \* \* \*", cron["spec"]["schedule"])  # daily
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    for workload in (init, sync, cron):
        args = _rotate_args(workload)
        assert args.namespace == NS and args.secret == "gpufrac-webhook-tls"
        assert args.service == "gpufrac-webhook"
        assert args.webhook_configs == ["gpufrac"]
        assert one(default, "MutatingWebhookConfiguration")["metadata"]["name"] == "gpufrac"
        assert one(default, "ValidatingWebhookConfiguration")["metadata"]["name"] == "gpufrac"
        assert args.renew_before_days == 30 and args.cert_validity_days == 365
        assert args.ignore_missing_webhook_configs is (workload is init)
    # Narrow RBAC: the one Secret and the two configurations, by name.
    cron_sa = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["serviceAccountName"]
    hook_sa = init["spec"]["template"]["spec"]["serviceAccountName"]
    for sa in (cron_sa, hook_sa):
        role = one(default, "Role", sa)
        rules = _rules(role)
        assert rules == {("", "secrets", "create", ()), ("", "secrets", "get", ("gpufrac-webhook-tls",)),
                         ("", "secrets", "update", ("gpufrac-webhook-tls",)),
                         ("", "secrets", "patch", ("gpufrac-webhook-tls",))}
        crules = _rules(one(default, "ClusterRole", sa))
        assert crules == {("admissionregistration.k8s.io", r, v, ("gpufrac",))
                          for r in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
                          for v in ("get", "patch")}
        for kind in ("RoleBinding", "ClusterRoleBinding"):
            subjects = one(default, kind, sa)["subjects"]
            assert subjects == [{"kind": "ServiceAccount", "name": sa, "namespace": NS}]
    # The hook copies exist before the Job on install and go away after it.
    for kind in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"):
        ann = one(default, kind, hook_sa)["metadata"]["annotations"]
        assert int(ann["helm.sh/hook-weight"]) < int(init["metadata"]["annotations"]["helm.sh/hook-weight"])
        assert "pre-install" in ann["helm.sh/hook"] and "post-install" in ann["helm.sh/hook"]
    assert not find(default, "Certificate")
    assert "annotations" not in one(default, "MutatingWebhookConfiguration")["metadata"]


def test_cert_manager_mode() -> None:
    objs = render(*CERT_MANAGER)
    assert not certificate_jobs(objs)
    issuers = {i["metadata"]["name"]: i for i in find(objs, "Issuer")}
    certs = {c["metadata"]["name"]: c for c in find(objs, "Certificate")}
    assert issuers["gpufrac-selfsigned"]["spec"] == {"selfSigned": {}}
    ca = certs["gpufrac-ca"]["spec"]
    assert ca["isCA"] is True and ca["issuerRef"]["name"] == "gpufrac-selfsigned"
    assert issuers["gpufrac-ca"]["spec"] == {"ca": {"secretName": ca["secretName"]}}
    serving = certs["gpufrac-webhook-serving"]
    assert serving["spec"]["issuerRef"]["name"] == "gpufrac-ca"
    assert "gpufrac-webhook.gpufrac-system.svc" in serving["spec"]["dnsNames"]
    dep = one(objs, "Deployment")
    (vol,) = [v for v in dep["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert vol["secret"]["secretName"] == serving["spec"]["secretName"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        ann = one(objs, kind)["metadata"]["annotations"]
        assert ann["cert-manager.io/inject-ca-from"] == f"{NS}/gpufrac-webhook-serving"
    for obj in [*issuers.values(), *certs.values()]:
        assert obj["apiVersion"] == "cert-manager.io/v1" and obj["metadata"]["namespace"] == NS
    # An existing issuer replaces the chart's CA chain.
    objs = render(*CERT_MANAGER, "--set", "certs.certManager.issuerRef.kind=ClusterIssuer",
                  "--set", "certs.certManager.issuerRef.name=corp")
    assert not find(objs, "Issuer")
    (serving,) = find(objs, "Certificate")
    assert serving["spec"]["issuerRef"] == {
        "group": "cert-manager.io", "kind": "ClusterIssuer", "name": "corp"
    }


def test_external_ca_bundle_in_service_mode() -> None:
    objs = render("--set", f"webhook.clientConfig.caBundle={CA_BUNDLE}")
    assert mutating(objs)["clientConfig"]["caBundle"] == CA_BUNDLE
    assert "service" in mutating(objs)["clientConfig"]
    assert not certificate_jobs(objs)


@pytest.mark.parametrize(("user", "called"), [("system:serviceaccount:kai-scheduler:binder", False), ("alice", True)])
def test_the_schedulers_bind_update_meets_the_gates_of_the_mutating_webhook_alone(
        default: list[dict[str, Any]], user: str, called: bool) -> None:
    """Issue 47: the validating webhook and the pods policy keep the scheduler's UPDATE out (the mutating webhook
    judges it whole), and their key-by-key comparison passes it without reading every key, as the API server
    evaluates every condition. A user's change of the same key is judged by all three."""
    bind = changed({"nvidia.com/container.app.gpus.devices": "GPU-1"})
    request = {"operation": "UPDATE", "userInfo": {"username": user, "groups": ["system:authenticated"]}}

    def all_true(gate: dict[str, Any]) -> bool:
        return all(bool(cel.evaluate(c["expression"], object=bind, oldObject=FRACTIONAL, request=request))
                   for c in gate["matchConditions"])

    assert all_true(mutating(default))
    assert all_true(validating(default)) is called
    assert all(all_true(p["spec"]) is called for p in pod_policies(default) if p["metadata"]["name"].endswith("-pods"))
