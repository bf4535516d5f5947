"""bench/fraction_floor.py without a server: from two stores of a seed pod (nothing installed, gpufrac's defaults) it
takes exactly gpufrac's additions, sends them as gpufrac stores them, and writes them as one constant policy or by
the constant webhook (bench/constant_app.py). The stores here are the webhook's own answer (gpufrac review's pod)
with what the API server adds around it (the ServiceAccount's token volume under a random name, the name, the
server's metadata, the status)."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonpatch
import pytest

from bench import constant_app, fraction_floor
from bench.admission_tax import SEED_SHAPES
from gpufrac.webhook.decide.policy import Policy, UserInfo
from gpufrac.webhook.offline import review

USER = UserInfo("alice")


def _pod(annotations: dict[str, str], name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-a", "labels": {"gpufrac-bench": "1"},
                         "annotations": dict(annotations)},
            "spec": {"schedulerName": "kai-scheduler",
                     "containers": [{"name": "app", "image": "cuda", "command": ["sleep", "infinity"]}]}}


def _as_stored(pod: dict[str, Any], token: str) -> dict[str, Any]:
    """What the API server adds to a pod it stores, whatever admission did."""
    out = copy.deepcopy(pod)
    out["metadata"].update(uid=f"uid-{token}", resourceVersion="7", creationTimestamp="2026-12-07T00:00:00Z")
    out["spec"]["volumes"] = [{"name": f"kube-api-access-{token}", "projected": {"sources": []}},
                              *out["spec"].get("volumes", [])]
    for c in out["spec"]["containers"]:
        c["volumeMounts"] = [{"name": f"kube-api-access-{token}", "mountPath": "/var/run/secrets"},
                             *c.get("volumeMounts", [])]
    out["status"] = {"phase": "Pending"}
    return out


def _webhooks(pod: dict[str, Any]) -> dict[str, Any]:
    result = review(pod, None, USER, Policy(require_enforcing_node=True))  # the chart's default: a node affinity
    assert result.allowed, result.message
    return result.object


def _shapes() -> list[fraction_floor.Shape]:
    return [fraction_floor.shape(a, _as_stored(_pod(a, "p"), "aaaaa"), _as_stored(_webhooks(_pod(a, "m")), "bbbbb"))
            for a in SEED_SHAPES]


@pytest.mark.parametrize("annotations", SEED_SHAPES, ids=["inference", "notebook"])
def test_a_shape_sends_the_pod_gpufrac_stores(annotations: dict[str, str]) -> None:
    plain = _as_stored(_pod(annotations, "tax-1"), "aaaaa")
    mutated = _as_stored(_webhooks(_pod(annotations, "tax-2")), "bbbbb")
    shape = fraction_floor.shape(annotations, plain, mutated)
    sent = shape.stored(_pod(annotations, "tax-3"))
    assert sent == _webhooks(_pod(annotations, "tax-3"))
    # What differs between two stores of one request is never copied: not the token volume, not the name.
    written = json.dumps(shape.patch)
    assert "kube-api-access" not in written and "tax-" not in written and "uid-" not in written
    # Appends where the API server put its own entries first (its token volume and mount).
    assert {op["path"] for op in shape.patch if op["path"].endswith("/-")} >= {"/spec/volumes/-"}


def test_stores_are_the_same_but_for_what_each_store_differs_in() -> None:
    annotations = SEED_SHAPES[0]
    one = _as_stored(_webhooks(_pod(annotations, "tax-1")), "aaaaa")
    two = _as_stored(_webhooks(_pod(annotations, "tax-2")), "bbbbb")
    assert fraction_floor.same_but_token(one, two)
    two["metadata"]["annotations"]["gpufrac.io/container.app.compute-mode"] = "time-slicing"
    assert not fraction_floor.same_but_token(one, two)


def test_nothing_added_is_an_error_not_a_floor() -> None:
    pod = _as_stored(_pod(SEED_SHAPES[0], "tax-1"), "aaaaa")
    with pytest.raises(RuntimeError, match="added nothing"):
        fraction_floor.shape(SEED_SHAPES[0], pod, _as_stored(_pod(SEED_SHAPES[0], "tax-2"), "bbbbb"))


def test_the_policy_writes_each_shape_only_on_its_own_pods() -> None:
    shapes = _shapes()
    policy, binding = fraction_floor.policy_objects(shapes, {"gpufrac-bench": "1"})
    spec = policy["spec"]
    assert spec["reinvocationPolicy"] == "Never" and spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["objectSelector"] == {"matchLabels": {"gpufrac-bench": "1"}}
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    expressions = [m["jsonPatch"]["expression"] for m in spec["mutations"]]
    assert len(expressions) == len(SEED_SHAPES)
    for expression, seed, shape in zip(expressions, SEED_SHAPES, shapes, strict=True):
        guard, _, rest = expression.partition(" ? ")
        for key, value in seed.items():
            assert f"[?{json.dumps(key)}].orValue('') == {json.dumps(value)}" in guard
        assert rest.endswith(" : []")
        assert rest.count("JSONPatch{") == len(shape.patch)


def test_a_value_is_a_cel_literal_of_mixed_types() -> None:
    literal = fraction_floor._cel({"name": "x", "csi": {"readOnly": True, "size": 2}, "mounts": ["a"]})
    assert literal == ('{"name": dyn("x"), "csi": dyn({"readOnly": dyn(true), "size": dyn(2)}), '
                       '"mounts": dyn([dyn("a")])}')


def test_metadata_only_keeps_the_label_annotations_and_affinity_and_no_spec_of_the_containers() -> None:
    annotations = SEED_SHAPES[0]
    mutated = _webhooks(_pod(annotations, "tax-2"))
    whole = fraction_floor.shape(annotations, _as_stored(_pod(annotations, "tax-1"), "aaaaa"),
                                 _as_stored(mutated, "bbbbb"))
    sent = whole.metadata_only().stored(_pod(annotations, "tax-3"))
    assert sent["metadata"]["labels"] == mutated["metadata"]["labels"]
    assert sent["metadata"]["annotations"] == mutated["metadata"]["annotations"]
    assert sent["spec"]["affinity"] == mutated["spec"]["affinity"]
    assert sent["spec"]["containers"] == _pod(annotations, "tax-3")["spec"]["containers"]  # no env, no mounts
    assert "volumes" not in sent["spec"]
    assert len(whole.metadata_only().patch) < len(whole.patch)


def _admitted(client: Any, path: str, pod: dict[str, Any]) -> dict[str, Any]:
    """`pod` as the constant webhook's answer at `path` leaves it (its patch applied as the API server would)."""
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "u-1", "operation": "CREATE", "object": pod}}
    answer = client.post(path, json=review).get_json()["response"]
    assert answer["uid"] == "u-1" and answer["allowed"] is True
    if "patch" not in answer:
        return pod
    assert answer["patchType"] == "JSONPatch"
    return jsonpatch.apply_patch(pod, json.loads(base64.b64decode(answer["patch"])))


@pytest.mark.parametrize("annotations", SEED_SHAPES, ids=["inference", "notebook"])
def test_the_constant_webhook_answers_each_pod_with_the_pod_gpufrac_stores(annotations: dict[str, str]) -> None:
    variants = fraction_floor.variants(_shapes())
    app = constant_app.create_app(constant_app.load_answers(fraction_floor.answers(variants)))
    client = app.test_client()
    # What the API server sends a webhook: the user's pod with its token volume and mount already in.
    seen = _as_stored(_pod(annotations, "tax-5"), "ccccc")
    seen["metadata"] = {k: v for k, v in seen["metadata"].items() if k in ("name", "namespace", "labels",
                                                                          "annotations")}
    del seen["status"]
    stored = _as_stored(_webhooks(_pod(annotations, "tax-5")), "ccccc")
    assert fraction_floor.same_but_token(_admitted(client, "/mutate/whole", seen), stored)
    metadata_only = _admitted(client, "/mutate/metadata", seen)
    assert metadata_only["metadata"]["annotations"] == stored["metadata"]["annotations"]
    assert metadata_only["spec"]["containers"] == seen["spec"]["containers"]
    # A pod no shape matches is let through unchanged; a variant the file does not name is not found.
    plain = {**seen, "metadata": {**seen["metadata"], "annotations": {}}}
    assert _admitted(client, "/mutate/whole", plain) == plain
    assert client.post("/mutate/other", json={}).status_code == 404


def test_the_constant_webhook_is_the_cheapest_registration() -> None:
    configuration = fraction_floor.webhook_configuration("https://127.0.0.1:1/mutate/whole", "Q0E=",
                                                         {"gpufrac-bench": "1"})
    (webhook,) = configuration["webhooks"]
    assert "matchConditions" not in webhook  # nothing evaluated before the call
    assert webhook["reinvocationPolicy"] == "Never" and webhook["failurePolicy"] == "Fail"
    assert webhook["objectSelector"] == {"matchLabels": {"gpufrac-bench": "1"}}
    assert webhook["rules"][0]["operations"] == ["CREATE"]
    assert webhook["clientConfig"] == {"url": "https://127.0.0.1:1/mutate/whole", "caBundle": "Q0E="}
