"""What must still work beside the escape attempts (each attempt is a case of e2e/denial_corpus.py, sent by
tests/e2e/test_denials.py): the webhook's own values on CREATE are recomputed, not refused; a plain Binding by the
scheduler binds; `kubectl debug` without GPU env gets no GPU. Each in a namespace of the test's own."""

from __future__ import annotations

import json

import pytest

from e2e.denial_corpus import LABEL, C
from e2e.names import NODE_NAME
from e2e.testing import Kubectl, create, pod

pytestmark = pytest.mark.e2e


def _get(admin: Kubectl, name: str) -> dict:
    rc, out, err = admin("get", "pod", name, "-o", "json")
    assert rc == 0, err
    return json.loads(out)


def _create_ok(kubectl: Kubectl, obj: dict) -> dict:
    rc, out, err = create(kubectl, obj)
    assert rc == 0, err
    return json.loads(out)


def test_users_canonical_values_on_create_are_replaced_not_kept(alice, admin, ns):
    """On CREATE the webhook's own annotations and label are recomputed (with a warning), never taken from the
    user."""
    ann = {"gpu-memory": "4096", C + "gpu-memory.limit-mib": "999999", C + "mps-pinned-mem-limit": "0=999999M"}
    manifest = pod("canonical", ann, namespace=ns)
    manifest["metadata"]["labels"] = {LABEL: "false"}
    rc, _, err = create(alice, manifest)
    assert rc == 0, err
    assert "Warning:" in err and C + "gpu-memory.limit-mib" in err
    stored = _get(admin, "canonical")
    assert stored["metadata"]["annotations"][C + "gpu-memory.limit-mib"] == "4096"
    assert stored["metadata"]["annotations"][C + "mps-pinned-mem-limit"] == "0=4096M"
    assert stored["metadata"]["labels"][LABEL] == "true"


def test_a_plain_binding_by_the_scheduler_still_binds(alice, binder, admin, ns):
    before = _create_ok(alice, pod("plain-bind", {"gpu-fraction": "0.5"}, namespace=ns))
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "plain-bind"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME}}
    rc, _, err = binder("create", "--raw", f"/api/v1/namespaces/{ns}/pods/plain-bind/binding", "-f", "-",
                        input=json.dumps(binding))
    assert rc == 0, err
    after = _get(admin, "plain-bind")
    assert after["spec"]["nodeName"] == NODE_NAME
    assert after["metadata"]["annotations"] == before["metadata"]["annotations"]


def test_debug_container_without_env_gets_no_gpu(alice, admin, ns):
    before = _create_ok(alice, pod("debug-ok", {"gpu-fraction": "0.5"}, namespace=ns))
    res = alice("debug", "pod/debug-ok", "--image=busybox:1.37", "--target=app", "--profile=general")
    assert res.rc == 0, res.stderr
    after = _get(admin, "debug-ok")
    [debugger] = after["spec"]["ephemeralContainers"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in debugger["env"]
    assert after["metadata"]["annotations"] == before["metadata"]["annotations"]
