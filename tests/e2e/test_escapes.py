"""Escape attempts: ways a user (or the scheduler) could try to leave a GPU fraction, each driven through the real
API server with kubectl, each refused by a gpufrac webhook, and each leaving the stored pod exactly as it was.

Every test checks two things: what kubectl shows (the webhook's name and what its message names), and, read back
as admin, that nothing was stored (same resourceVersion, annotations, labels and spec; or no pod at all for a
CREATE).
"""

from __future__ import annotations

import json

import pytest

from e2e.denial_corpus import DEVICES, KAI_PORTION, LABEL, NV, TS_DIR, TS_VOLUME, C  # the corpus's names
from e2e.kubectl import KubectlResult
from e2e.names import NODE_NAME, USER_NAMESPACE
from e2e.testing import Kubectl, assert_denied, create, example, pod, unique
from testkit.pods import IMAGE

pytestmark = pytest.mark.e2e

# ---- helpers -------------------------------------------------------------------------------------------------


def _get(admin: Kubectl, name: str) -> dict:
    rc, out, err = admin("get", "pod", name, "-n", USER_NAMESPACE, "-o", "json")
    assert rc == 0, err
    return json.loads(out)


def _absent(admin: Kubectl, name: str) -> None:
    rc, out, err = admin("get", "pod", name, "-n", USER_NAMESPACE, "-o", "name")
    assert rc != 0 and "NotFound" in err, f"a denied CREATE stored pod {name}: {out}"


def _unchanged(admin: Kubectl, before: dict) -> dict:
    """The stored pod is still `before` (read back as admin): the denied request stored nothing."""
    after = _get(admin, before["metadata"]["name"])
    for part in ("annotations", "labels"):
        assert after["metadata"].get(part) == before["metadata"].get(part), f"metadata.{part} changed"
    assert after["spec"] == before["spec"], "spec changed"
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], "pod was written"
    return after


def _denied(res: KubectlResult, *fragments: str) -> str:
    """Refused by validate.gpufrac.io or mutate.gpufrac.io, with a message naming every fragment."""
    return assert_denied(res, *fragments)


def _create_ok(kubectl: Kubectl, obj: dict) -> dict:
    rc, out, err = create(kubectl, obj)
    assert rc == 0, err
    return json.loads(out)


def _apply_ok(kubectl: Kubectl, obj: dict) -> None:
    rc, _, err = kubectl("apply", "-f", "-", input=json.dumps(obj))
    assert rc == 0, err


def _binding(name: str, annotations: dict[str, str] | None = None) -> str:
    meta: dict = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME},
        }
    )


def _post_binding(kubectl: Kubectl, name: str, annotations: dict[str, str] | None = None) -> KubectlResult:
    path = f"/api/v1/namespaces/{USER_NAMESPACE}/pods/{name}/binding"
    return kubectl("create", "--raw", path, "-f", "-", input=_binding(name, annotations))


BIND_VALUES = {DEVICES: "GPU-a,GPU-b", NV + "gpu-memory.request": "71885Mi", NV + "gpu-memory.limit": "115016Mi"}


def _bound_notebook(alice: Kubectl, binder: Kubectl, admin: Kubectl) -> dict:
    """The seed notebook (portion 0.5 → 0.8 of two GPUs), bound the way KAI's binder does it; returns the stored
    pod."""
    name = unique("esc-notebook")
    _create_ok(alice, example("notebook-time-slicing.yaml", name))
    rc, _, err = binder(
        "patch", "pod", name, "--type=merge", "-p", json.dumps({"metadata": {"annotations": BIND_VALUES}})
    )
    assert rc == 0, err
    rc, _, err = _post_binding(binder, name)
    assert rc == 0, err
    stored = _get(admin, name)
    assert stored["spec"].get("nodeName") == NODE_NAME
    assert stored["metadata"]["annotations"][C + "gpu-memory.limit-mib"] == "115016"
    return stored


def _sidecar(env: list[dict] | None = None, mounts: list[dict] | None = None, **extra: object) -> dict:
    ctr: dict = {"name": "side", "image": "busybox:1.37", **extra}
    if env is not None:
        ctr["env"] = env
    if mounts is not None:
        ctr["volumeMounts"] = mounts
    return ctr


def _escaped(admin: Kubectl, name: str, res: KubectlResult) -> str:
    """A readable failure when an escape got through."""
    stored = json.dumps(_get(admin, name)["metadata"])[:600]
    return f"not denied (rc={res.rc}): {res.stderr.strip()[:300]}; stored metadata: {stored}"


# ---- fraction annotations and the label, on UPDATE, after bind ---------------------------------------------

_JSON_REMOVE = "remove"


def _ptr(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


@pytest.mark.parametrize(
    "verb, key, value",
    [
        pytest.param("json-remove", DEVICES, None, id="remove-devices"),
        pytest.param("json-replace", DEVICES, "GPU-c,GPU-d", id="replace-devices"),
        pytest.param("json-remove", NV + "gpu-memory.request", None, id="remove-bind-request"),
        pytest.param("annotate", NV + "gpu-memory.limit", "140000Mi", id="raise-bind-limit"),
        pytest.param("json-remove", NV + "gpu-compute.mode", None, id="remove-mode"),
        pytest.param("json-remove", KAI_PORTION, None, id="remove-portion-limit"),
        pytest.param("annotate", KAI_PORTION, "0.99", id="raise-portion-limit"),
        pytest.param("annotate", "gpu-fraction", "0.9", id="raise-gpu-fraction"),
        pytest.param("json-remove", "gpu-fraction", None, id="remove-gpu-fraction"),
        pytest.param("annotate", C + "gpu-memory.limit-mib", "143770", id="raise-canonical-limit-mib"),
        pytest.param("annotate", C + "mps-pinned-mem-limit", "0=143770M,1=143770M", id="raise-pinned-limit"),
        pytest.param("json-remove", C + "mps-pinned-mem-limit", None, id="remove-pinned-limit"),
        pytest.param("annotate", C + "compute-mode", "sm-sharing", id="change-canonical-mode"),
        pytest.param("annotate", "gpufrac.io/unlimited", "true", id="add-own-gpufrac-key"),
    ],
)
def test_user_edits_a_fraction_annotation_of_a_bound_pod(alice, binder, admin, verb, key, value):
    before = _bound_notebook(alice, binder, admin)
    name = before["metadata"]["name"]
    if verb == "annotate":
        res = alice("annotate", "--overwrite", "pod", name, f"{key}={value}")
    else:
        op = {"op": verb.removeprefix("json-"), "path": f"/metadata/annotations/{_ptr(key)}"}
        if value is not None:
            op["value"] = value
        res = alice("patch", "pod", name, "--type=json", "-p", json.dumps([op]))
    _denied(res, key)
    _unchanged(admin, before)


@pytest.mark.parametrize(
    "args",
    [
        pytest.param([f"{LABEL}-"], id="remove"),
        pytest.param(["--overwrite", f"{LABEL}=false"], id="set-false"),
    ],
)
def test_user_removes_or_changes_the_fractional_label(alice, binder, admin, args):
    before = _bound_notebook(alice, binder, admin)
    res = alice("label", "pod", before["metadata"]["name"], *args)
    _denied(res, f"label {LABEL}")
    _unchanged(admin, before)


def test_one_json_patch_removing_every_fraction_key_and_the_label_is_still_reviewed(alice, binder, admin):
    """The new object carries no fraction key at all: only the matchConditions' look at oldObject sends it to the
    webhook."""
    before = _bound_notebook(alice, binder, admin)
    prefixes = ("nvidia.com/", "kai.scheduler/", "gpufrac.io/", "gpu-")
    keys = [k for k in before["metadata"]["annotations"] if k.startswith(prefixes)]
    assert DEVICES in keys and C + "compute-mode" in keys and "gpu-fraction" in keys
    ops = [{"op": "remove", "path": f"/metadata/annotations/{_ptr(k)}"} for k in keys]
    ops.append({"op": "remove", "path": f"/metadata/labels/{_ptr(LABEL)}"})
    res = alice("patch", "pod", before["metadata"]["name"], "--type=json", "-p", json.dumps(ops))
    msg = _denied(res, DEVICES, "gpu-fraction", f"label {LABEL}")
    assert "was removed" in msg
    _unchanged(admin, before)


def test_the_scheduler_cannot_change_or_remove_devices_after_bind(alice, binder, admin):
    before = _bound_notebook(alice, binder, admin)
    name = before["metadata"]["name"]
    _denied(binder("annotate", "--overwrite", "pod", name, f"{DEVICES}=GPU-c,GPU-d"), DEVICES, "was changed")
    _denied(binder("annotate", "pod", name, f"{DEVICES}-"), DEVICES, "was removed")
    _unchanged(admin, before)


def test_admin_is_no_exception(alice, binder, admin):
    """system:masters skips RBAC, not admission: a cluster admin is not the scheduler either."""
    before = _bound_notebook(alice, binder, admin)
    _denied(admin("annotate", "--overwrite", "pod", before["metadata"]["name"], f"{DEVICES}=GPU-z"), DEVICES)
    _unchanged(admin, before)


def test_fraction_annotations_cannot_change_through_pods_status(alice, binder, admin):
    before = _bound_notebook(alice, binder, admin)
    name = before["metadata"]["name"]
    patch = {
        "metadata": {
            "annotations": {DEVICES: "GPU-a,GPU-b,GPU-c,GPU-d", C + "gpu-memory.limit-mib": "143770"},
            "labels": {LABEL: None},
        }
    }
    res = admin("patch", "pod", name, "--subresource=status", "--type=merge", "-p", json.dumps(patch))
    # The chart's ValidatingAdmissionPolicy judges pods/status (the webhook does not, so an outage never blocks it).
    assert res.rc != 0 and "ValidatingAdmissionPolicy 'gpufrac-pods-status'" in res.stderr, _escaped(admin, name, res)
    _denied(res, DEVICES)
    _unchanged(admin, before)


# ---- on UPDATE, before bind: kubectl apply of an edited manifest, annotate, json add -------------------------


def _applied_portion_pod(alice: Kubectl, admin: Kubectl) -> tuple[dict, dict]:
    """A portion pod created with `kubectl apply` (so a later apply can remove keys); (manifest, stored)."""
    manifest = pod(unique("esc-applied"), {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.6"})
    _apply_ok(alice, manifest)
    return manifest, _get(admin, manifest["metadata"]["name"])


@pytest.mark.parametrize(
    "edit, key",
    [
        pytest.param({"gpu-fraction.limit": None}, "gpu-fraction.limit", id="remove-shorthand-limit"),
        pytest.param({"gpu-fraction": "0.9", "gpu-fraction.limit": "0.95"}, "gpu-fraction", id="raise-fraction"),
        pytest.param({NV + "gpu-compute.mode": "sm-sharing"}, NV + "gpu-compute.mode", id="set-mode"),
        pytest.param({DEVICES: "GPU-a"}, DEVICES, id="set-devices"),
        pytest.param({NV + "gpu-memory.limit": "80Gi"}, NV + "gpu-memory.limit", id="set-bind-limit"),
        pytest.param({C + "gpu-memory.limit-mib": "81920"}, C + "gpu-memory.limit-mib", id="set-canonical-mib"),
    ],
)
def test_user_applies_an_edited_manifest(alice, admin, edit, key):
    manifest, before = _applied_portion_pod(alice, admin)
    for k, v in edit.items():
        if v is None:
            del manifest["metadata"]["annotations"][k]
        else:
            manifest["metadata"]["annotations"][k] = v
    res = alice("apply", "-f", "-", input=json.dumps(manifest))
    _denied(res, key)
    _unchanged(admin, before)


def test_user_server_side_applies_a_manifest_without_the_fraction(alice, admin):
    name = unique("esc-ssa")
    manifest = pod(name, {"gpu-fraction": "0.5"})
    rc, _, err = alice("apply", "--server-side", "-f", "-", input=json.dumps(manifest))
    assert rc == 0, err
    before = _get(admin, name)
    manifest["metadata"]["annotations"] = {}
    res = alice("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(manifest))
    _denied(res, "gpu-fraction", "was removed")
    _unchanged(admin, before)


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        pytest.param(NV + "gpu-memory.request", "70Gi", "only the scheduler may add it", id="bind-request"),
        pytest.param(NV + "gpu-memory.limit", "140Gi", "only the scheduler may add it", id="bind-limit"),
        pytest.param(DEVICES, "GPU-a", "only the scheduler may add it", id="devices"),
        pytest.param(KAI_PORTION, "0.9", "cannot be added", id="portion-limit"),
    ],
)
def test_user_adds_bind_time_values_to_a_portion_pod(alice, admin, key, value, fragment):
    before = _create_ok(alice, pod(unique("esc-portion"), {"gpu-fraction": "0.5"}))
    op = [{"op": "add", "path": f"/metadata/annotations/{_ptr(key)}", "value": value}]
    res = alice("patch", "pod", before["metadata"]["name"], "--type=json", "-p", json.dumps(op))
    _denied(res, key, fragment)
    _unchanged(admin, before)


@pytest.mark.parametrize(
    "args, fragment",
    [
        pytest.param(["annotate", "gpu-fraction=0.5"], "annotation gpu-fraction", id="gpu-fraction"),
        pytest.param(["annotate", f"{NV}gpu-memory.request=8Gi"], NV + "gpu-memory.request", id="memory-request"),
        pytest.param(["annotate", f"{DEVICES}=GPU-a"], DEVICES, id="devices"),
        pytest.param(["annotate", f"{C}compute-mode=sm-sharing"], C + "compute-mode", id="canonical"),
        pytest.param(["label", f"{LABEL}=true"], f"label {LABEL}", id="label"),
    ],
)
def test_user_turns_a_plain_pod_fractional_after_create(alice, admin, args, fragment):
    before = _create_ok(alice, pod(unique("esc-plain")))
    verb, *rest = args
    res = alice(verb, "pod", before["metadata"]["name"], *rest)
    _denied(res, fragment)
    _unchanged(admin, before)


# ---- on CREATE -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "annotations, labels, fragment",
    [
        pytest.param(
            {"gpu-fraction": "0.5", "gpufrac.io/unlimited": "true"},
            {},
            "gpufrac.io/unlimited",
            id="own-key-on-fractional",
        ),
        pytest.param({C + "compute-mode": "sm-sharing"}, {}, C + "compute-mode", id="canonical-on-plain"),
        pytest.param({}, {LABEL: "true"}, f"label {LABEL}", id="label-on-plain"),
        pytest.param({NV + "gpu-memory.request": "8Gi", DEVICES: "GPU-a"}, {}, DEVICES, id="devices-absolute"),
        pytest.param(
            {"gpu-fraction": "0.5", "nvidia.com/container.side.gpus.devices": "GPU-a"},
            {},
            "nvidia.com/container.side.gpus.devices",
            id="devices-for-sidecar",
        ),
        pytest.param(
            {"gpu-fraction": "0.5", NV + "gpu-memory.limit": "80Gi"},
            {},
            NV + "gpu-memory.limit",
            id="bind-limit-on-portion",
        ),
    ],
)
def test_user_creates_a_pod_with_what_only_gpufrac_or_the_scheduler_writes(alice, admin, annotations, labels, fragment):
    manifest = pod(unique("esc-create"), annotations, [{"name": "app", "image": IMAGE}, _sidecar()])
    manifest["metadata"]["labels"] = labels
    _denied(create(alice, manifest), fragment)
    _absent(admin, manifest["metadata"]["name"])


def test_users_canonical_values_on_create_are_replaced_not_kept(alice, admin):
    """On CREATE the webhook's own annotations and label are recomputed (with a warning), never taken from the
    user."""
    ann = {"gpu-memory": "4096", C + "gpu-memory.limit-mib": "999999", C + "mps-pinned-mem-limit": "0=999999M"}
    manifest = pod(unique("esc-canonical"), ann)
    manifest["metadata"]["labels"] = {LABEL: "false"}
    rc, _, err = create(alice, manifest)
    assert rc == 0, err
    assert "Warning:" in err and C + "gpu-memory.limit-mib" in err
    stored = _get(admin, manifest["metadata"]["name"])
    assert stored["metadata"]["annotations"][C + "gpu-memory.limit-mib"] == "4096"
    assert stored["metadata"]["annotations"][C + "mps-pinned-mem-limit"] == "0=4096M"
    assert stored["metadata"]["labels"][LABEL] == "true"


# ---- pods/binding --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "who, annotations, key",
    [
        pytest.param("alice", {DEVICES: "GPU-a"}, DEVICES, id="alice-devices"),
        pytest.param("alice", {C + "gpu-memory.limit-mib": "143770"}, C + "gpu-memory.limit-mib", id="alice-canonical"),
        pytest.param("binder", {DEVICES: "GPU-a"}, DEVICES, id="binder-devices"),
        pytest.param("binder", {NV + "gpu-memory.limit": "140Gi"}, NV + "gpu-memory.limit", id="binder-bind-limit"),
        pytest.param(
            "binder",
            {"gpufrac.io/unlimited": "true", "example.com/x": "y"},
            "gpufrac.io/unlimited",
            id="binder-own-key",
        ),
        pytest.param("binder", {"gpu-fraction": "0.9"}, "gpu-fraction", id="binder-shorthand"),
    ],
)
def test_fraction_keys_cannot_ride_a_binding(request, admin, who, annotations, key):
    kubectl = request.getfixturevalue(who)
    alice = request.getfixturevalue("alice")
    before = _create_ok(alice, pod(unique("esc-binding"), {"gpu-fraction": "0.5"}))
    before = _get(admin, before["metadata"]["name"])
    res = _post_binding(kubectl, before["metadata"]["name"], annotations)
    _denied(res, key, "Binding")
    after = _unchanged(admin, before)
    assert not after["spec"].get("nodeName")


def test_a_plain_binding_by_the_scheduler_still_binds(alice, binder, admin):
    before = _create_ok(alice, pod(unique("esc-plain-bind"), {"gpu-fraction": "0.5"}))
    rc, _, err = _post_binding(binder, before["metadata"]["name"])
    assert rc == 0, err
    after = _get(admin, before["metadata"]["name"])
    assert after["spec"]["nodeName"] == NODE_NAME
    assert after["metadata"]["annotations"] == before["metadata"]["annotations"]


# ---- containers beside a fraction (CREATE) -------------------------------------------------------------------

_CUDA = [{"name": "app", "image": IMAGE}]


@pytest.mark.parametrize(
    "where, env, fragment",
    [
        pytest.param(
            "sidecar", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}], "NVIDIA_VISIBLE_DEVICES", id="sidecar-all"
        ),
        pytest.param(
            "sidecar",
            [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-a"}],
            "NVIDIA_VISIBLE_DEVICES",
            id="sidecar-uuid",
        ),
        pytest.param(
            "sidecar",
            [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}],
            "NVIDIA_VISIBLE_DEVICES",
            id="sidecar-duplicate-last-wins",
        ),
        pytest.param(
            "sidecar",
            [
                {
                    "name": "NVIDIA_VISIBLE_DEVICES",
                    "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{DEVICES}']"}},
                }
            ],
            "NVIDIA_VISIBLE_DEVICES",
            id="sidecar-fieldref",
        ),
        pytest.param(
            "init", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}], "NVIDIA_VISIBLE_DEVICES", id="init-all"
        ),
        pytest.param(
            "sidecar",
            [{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": TS_DIR}],
            "CUDA_MPS_PIPE_DIRECTORY",
            id="sidecar-mps-pipe",
        ),
        pytest.param(
            "sidecar",
            [{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"}],
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            id="sidecar-mps-threads",
        ),
        pytest.param(
            "init",
            [{"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": "143770"}],
            "NVIDIA_GPU_MEMORY_LIMIT",
            id="init-memory-limit",
        ),
        pytest.param(
            "init",
            [{"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=143770M"}],
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
            id="init-pinned-limit",
        ),
    ],
)
def test_container_beside_a_fraction_sets_gpu_env(alice, admin, where, env, fragment):
    manifest = pod(unique("esc-env"), {"gpu-fraction": "0.5"}, [*_CUDA])
    if where == "sidecar":
        manifest["spec"]["containers"].append(_sidecar(env))
        container = "container side"
    else:
        manifest["spec"]["initContainers"] = [{"name": "setup", "image": "busybox:1.37", "env": env}]
        container = "container setup"
    _denied(create(alice, manifest), container, fragment)
    _absent(admin, manifest["metadata"]["name"])


@pytest.mark.parametrize(
    "mode_annotations, volume, path, fragment",
    [
        pytest.param({}, None, None, "mounts the time-slicing MPS directory", id="sidecar-mounts-injected-volume"),
        pytest.param({}, "mine", TS_DIR, "volume mine", id="own-volume-same-dir"),
        pytest.param({}, "mine", "/run/gpufrac", "volume mine", id="gpufrac-root"),
        pytest.param({}, "mine", "/run/gpufrac/mps", "volume mine", id="mps-root"),
        pytest.param({}, "mine", "/run/gpufrac/mps/sm-sharing", "volume mine", id="other-mode-dir"),
        pytest.param({}, "mine", "/run//gpufrac/mps/./time-slicing/", "volume mine", id="unnormalized-path"),
        pytest.param({}, "mine", "/run", "volume mine", id="parent-run"),
        pytest.param({}, "mine", "/", "volume mine", id="host-root"),
        pytest.param(
            {},
            "mine",
            "/var/run/gpufrac/mps/time-slicing",
            "volume mine",
            id="var-run-alias",
        ),
        pytest.param(
            {},
            "mine",
            "/var/run",
            "volume mine",
            id="var-run-parent",
        ),
    ],
)
def test_sidecar_reaches_the_mps_directories(alice, admin, mode_annotations, volume, path, fragment):
    manifest = pod(unique("esc-mount"), {"gpu-fraction": "0.5", **mode_annotations}, [*_CUDA])
    if volume is None:
        manifest["spec"]["containers"].append(_sidecar(mounts=[{"name": TS_VOLUME, "mountPath": "/mps"}]))
    else:
        manifest["spec"]["volumes"] = [{"name": volume, "hostPath": {"path": path}}]
        manifest["spec"]["containers"].append(_sidecar(mounts=[{"name": volume, "mountPath": "/mps"}]))
    res = create(alice, manifest)
    if res.rc == 0:
        pytest.fail(_escaped(admin, manifest["metadata"]["name"], res))
    _denied(res, fragment)
    _absent(admin, manifest["metadata"]["name"])


def test_sidecar_with_its_own_volume_of_gpufracs_csi_driver_is_denied(alice, admin):
    manifest = pod(unique("esc-csi"), {"gpu-fraction": "0.5"}, [*_CUDA])
    manifest["spec"]["volumes"] = [{"name": "mine", "csi": {"driver": "mps.gpufrac.io",
                                                            "volumeAttributes": {"mode": "sm-sharing"}}}]
    manifest["spec"]["containers"].append(_sidecar(mounts=[{"name": "mine", "mountPath": "/mps"}]))
    _denied(create(alice, manifest), "volume mine", "uses gpufrac's CSI driver mps.gpufrac.io")
    _absent(admin, manifest["metadata"]["name"])


def test_fractional_container_mounts_the_other_modes_directory(alice, admin):
    manifest = pod(
        unique("esc-mount-other"),
        {"gpu-fraction": "0.5"},
        [{"name": "app", "image": IMAGE, "volumeMounts": [{"name": "sm", "mountPath": "/sm"}]}],
    )
    manifest["spec"]["volumes"] = [{"name": "sm", "hostPath": {"path": "/run/gpufrac/mps/sm-sharing"}}]
    _denied(create(alice, manifest), "volume sm", "/run/gpufrac/mps/sm-sharing")
    _absent(admin, manifest["metadata"]["name"])


# ---- ephemeral containers (kubectl debug, pods/ephemeralcontainers) ------------------------------------------


def _debug(alice: Kubectl, name: str, *args: str) -> KubectlResult:
    return alice("debug", f"pod/{name}", "--image=busybox:1.37", "--target=app", "--profile=general", *args)


def test_debug_container_without_env_gets_no_gpu(alice, admin):
    before = _create_ok(alice, pod(unique("esc-debug-ok"), {"gpu-fraction": "0.5"}))
    res = _debug(alice, before["metadata"]["name"])
    assert res.rc == 0, res.stderr
    after = _get(admin, before["metadata"]["name"])
    [debugger] = after["spec"]["ephemeralContainers"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in debugger["env"]
    assert after["metadata"]["annotations"] == before["metadata"]["annotations"]


@pytest.mark.parametrize(
    "env, fragment",
    [
        pytest.param("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES", id="visible-all"),
        pytest.param("NVIDIA_VISIBLE_DEVICES=GPU-a", "NVIDIA_VISIBLE_DEVICES", id="visible-uuid"),
        pytest.param(f"CUDA_MPS_PIPE_DIRECTORY={TS_DIR}", "CUDA_MPS_PIPE_DIRECTORY", id="mps-pipe"),
        pytest.param("NVIDIA_GPU_MEMORY_LIMIT=143770", "NVIDIA_GPU_MEMORY_LIMIT", id="memory-limit"),
    ],
)
def test_kubectl_debug_with_gpu_env_is_denied(alice, admin, env, fragment):
    before = _create_ok(alice, pod(unique("esc-debug-env"), {"gpu-fraction": "0.5"}))
    before = _get(admin, before["metadata"]["name"])
    res = _debug(alice, before["metadata"]["name"], f"--env={env}")
    _denied(res, "ephemeral container", fragment)
    _unchanged(admin, before)


def test_kubectl_debug_custom_mount_of_the_mps_volume_is_denied(alice, admin, tmp_path):
    before = _create_ok(alice, pod(unique("esc-debug-mount"), {"gpu-fraction": "0.5"}))
    before = _get(admin, before["metadata"]["name"])
    custom = tmp_path / "custom.json"
    custom.write_text(json.dumps({"volumeMounts": [{"name": TS_VOLUME, "mountPath": "/mps"}]}))
    res = _debug(alice, before["metadata"]["name"], f"--custom={custom}")
    _denied(res, "ephemeral container", "mounts the time-slicing MPS directory")
    _unchanged(admin, before)


@pytest.mark.parametrize(
    "spec, fragment",
    [
        pytest.param(
            {
                "env": [
                    {
                        "name": "NVIDIA_VISIBLE_DEVICES",
                        "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{DEVICES}']"}},
                    }
                ]
            },
            "NVIDIA_VISIBLE_DEVICES",
            id="fieldref-devices",
        ),
        pytest.param(
            {
                "env": [
                    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"},
                    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                ]
            },
            "NVIDIA_VISIBLE_DEVICES",
            id="duplicate-env",
        ),
        pytest.param(
            {"volumeMounts": [{"name": TS_VOLUME, "mountPath": "/mps"}]},
            "mounts the time-slicing MPS directory",
            id="mps-volume",
        ),
        pytest.param(
            {"env": [{"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=1G"}]},
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
            id="pinned-limit",
        ),
    ],
)
def test_raw_ephemeralcontainers_patch_is_denied(alice, binder, admin, spec, fragment):
    before = _bound_notebook(alice, binder, admin)
    name = before["metadata"]["name"]
    dbg = {"name": "dbg", "image": "busybox:1.37", "targetContainerName": "app", **spec}
    res = alice(
        "patch",
        "pod",
        name,
        "--subresource=ephemeralcontainers",
        "--type=strategic",
        "-p",
        json.dumps({"spec": {"ephemeralContainers": [dbg]}}),
    )
    _denied(res, "ephemeral container dbg", fragment)
    _unchanged(admin, before)


# ---- privileges and host namespaces (CREATE) -----------------------------------------------------------------


@pytest.mark.parametrize(
    "security_context, fragment",
    [
        pytest.param({"capabilities": {"add": ["SYS_ADMIN"]}}, "SYS_ADMIN", id="sys-admin"),
        pytest.param({"capabilities": {"add": ["NET_ADMIN", "CAP_SYS_ADMIN"]}}, "SYS_ADMIN", id="cap-sys-admin"),
        pytest.param(
            {"capabilities": {"add": ["ALL"]}},
            "SYS_ADMIN",
            id="all-capabilities",
        ),
        pytest.param(
            {"capabilities": {"add": ["sys_admin"]}},
            "SYS_ADMIN",
            id="lowercase-sys-admin",
        ),
        pytest.param({"privileged": True}, "privileged", id="privileged"),
    ],
)
def test_fractional_container_with_privileges(alice, admin, security_context, fragment):
    manifest = pod(
        unique("esc-priv"),
        {"gpu-fraction": "0.5"},
        [{"name": "app", "image": IMAGE, "securityContext": security_context}],
    )
    res = create(alice, manifest)
    if res.rc == 0:
        pytest.fail(_escaped(admin, manifest["metadata"]["name"], res))
    _denied(res, "container app", fragment)
    _absent(admin, manifest["metadata"]["name"])


def test_fractional_init_container_privileged(alice, admin):
    """A fraction on an init container (gpu-fraction-container-name) is held to the same rules."""
    manifest = pod(
        unique("esc-priv-init"),
        {"gpu-fraction": "0.5", "gpu-fraction-container-name": "setup"},
        [{"name": "main", "image": "busybox:1.37"}],
    )
    manifest["spec"]["initContainers"] = [{"name": "setup", "image": IMAGE, "securityContext": {"privileged": True}}]
    _denied(create(alice, manifest), "container setup", "privileged")
    _absent(admin, manifest["metadata"]["name"])


@pytest.mark.parametrize("field", ["hostPID", "hostIPC"])
def test_fractional_pod_shares_host_namespaces(alice, admin, field):
    manifest = pod(unique("esc-host"), {NV + "gpu-memory.request": "8Gi"}, None, **{field: True})
    _denied(create(alice, manifest), "pod", field)
    _absent(admin, manifest["metadata"]["name"])


# ---- fraction and whole GPUs in one pod (CREATE) -------------------------------------------------------------


@pytest.mark.parametrize("where", ["sidecar", "init"])
def test_whole_gpus_beside_a_fraction(alice, admin, where):
    whole = {"resources": {"limits": {"nvidia.com/gpu": "1"}}}
    manifest = pod(unique("esc-whole"), {"gpu-fraction": "0.5"}, [*_CUDA])
    if where == "sidecar":
        manifest["spec"]["containers"].append({"name": "side", "image": IMAGE, **whole})
        container = "container side"
    else:
        manifest["spec"]["initContainers"] = [{"name": "setup", "image": IMAGE, **whole}]
        container = "container setup"
    _denied(create(alice, manifest), container, "nvidia.com/gpu")
    _absent(admin, manifest["metadata"]["name"])
