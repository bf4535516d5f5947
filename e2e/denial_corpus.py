"""Every denial case of the e2e suite, once: what each request sends, as which user, against which prepared pod,
and what the refusal must name.

Three kinds of test read it and none writes a case of its own:
- tests/e2e/test_denials.py sends each case for real, as the user would, in a namespace of the test's own, and
  checks the refusal and that nothing was stored;
- tests/e2e/test_admission_policies.py sends each as a server-side dry run to the webhook, to the
  ValidatingAdmissionPolicies, and to both (one prepared pod per setup serves every case and every engine);
- tests/webhook/test_denial_corpus.py runs each CREATE through the webhook's decisions in process.

A case's id keeps the name of the test it was first written as (docs/admission-policies.md's table shows them).
`webhook_only` says why the policies are not expected to deny a case with its message (docs/admission-policies.md).
"""

from __future__ import annotations

import copy
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from e2e.kubectl import KubectlResult
from e2e.names import NODE_NAME
from e2e.testing import example, pod
from testkit.kai_oracle import SHARED_GPU_CONFIGMAP, kai_v017_mutate
from testkit.pods import IMAGE

NV = "nvidia.com/container.app."
KAI_PORTION = "kai.scheduler/container.app.gpu-memory.portion.limit"
C = "gpufrac.io/container.app."
LABEL = "gpufrac.io/fractional"
DEVICES = NV + "gpus.devices"
TS_VOLUME = "gpufrac-mps-time-slicing"
TS_DIR = "/run/gpufrac/mps/time-slicing"
DRY = "--dry-run=server"
NEW_POD = "corpus"  # a CREATE's pod: every test sends it in a namespace of its own, so one name serves them all

APPLIED_MANIFEST = {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.6"}
# What KAI's binder writes on the seed notebook (portion 0.5 -> 0.8 of two GPUs) before it binds it.
BIND_VALUES = {DEVICES: "GPU-a,GPU-b", NV + "gpu-memory.request": "71885Mi", NV + "gpu-memory.limit": "115016Mi"}

_NORMALIZED = "a hostPath written other than plainly needs the node's path normalization (CEL has none)"


@dataclass(frozen=True)
class Users:
    """kubectl as each user, every one bound to the namespace the cases run in."""

    alice: Callable[..., KubectlResult]
    binder: Callable[..., KubectlResult]
    admin: Callable[..., KubectlResult]

    def by_name(self, who: str) -> Callable[..., KubectlResult]:
        return {"alice": self.alice, "binder": self.binder, "admin": self.admin}[who]


@dataclass(frozen=True)
class Target:
    """Where a case goes: as which users, in which namespace, to which pod (the prepared one of its setup, or the new
    pod of a CREATE), and whether as a server-side dry run (nothing stored) or for real."""

    users: Users
    namespace: str
    name: str = NEW_POD
    dry: bool = True

    @property
    def dry_run(self) -> tuple[str, ...]:
        return (DRY,) if self.dry else ()


Send = Callable[[Target], KubectlResult]


@dataclass(frozen=True)
class Case:
    id: str  # the test it was first written as, [its parameters]
    send: Send
    fragments: tuple[str, ...]  # what the refusal's message names, whichever engine refuses
    setup: str = ""  # one of SETUPS, or "" for a CREATE
    webhook_only: str = ""
    # A fractional pod's CREATE whose values the mutating webhook accepts (a boundary, a key only the scheduler
    # writes): with the webhook down the pod comes unmutated, and the policies refuse it for that too (its canonical
    # annotations and label, or the env and mounts gpufrac injects, are missing), so their own message is compared
    # where the mutating webhook ran (both engines on), as the validating webhook only ever sees a mutated pod.
    unmutated: bool = False
    # Without the mutating webhook the API server's own validation refuses it first (a mount of a volume that only
    # the mutation adds), before any validating admission.
    invalid_unmutated: bool = False
    manifest: dict[str, Any] | None = field(default=None, compare=False)  # a CREATE's pod, as written
    denied_by: str = ""  # what kubectl must show beyond the message: the one engine that judges this request
    unsaid: tuple[str, ...] = ()  # what the message must not say (a misleading reason)

    @property
    def source(self) -> str:
        return self.id.partition("[")[0]


Prepare = Callable[[Users, str, str], list[KubectlResult]]  # (users, namespace, name) -> the requests, in order


def _bound(users: Users, namespace: str, name: str) -> list[KubectlResult]:
    return [users.alice("create", "-f", "-", input=json.dumps(example("notebook-time-slicing.yaml", name,
                                                                        namespace=namespace))),
            users.binder("patch", "pod", name, "--type=merge", "-p",
                         json.dumps({"metadata": {"annotations": BIND_VALUES}})),
            _post_binding(users.binder, namespace, name, {})]


def _stored_by(verb: tuple[str, ...], manifest: Callable[[str, str], dict[str, Any]]) -> Prepare:
    """alice's `kubectl <verb> -f -` of the manifest for (name, namespace)."""
    return lambda users, ns, name: [users.alice(*verb, "-f", "-", input=json.dumps(manifest(name, ns)))]


def _pod_with(annotations: dict[str, str] | None) -> Callable[[str, str], dict[str, Any]]:
    return lambda name, ns: pod(name, annotations, namespace=ns)


# The pods the UPDATE cases edit, by setup: how the users store one (with the webhook up), given its namespace and
# name. (SETUPS lists them.)
_SETUPS: dict[str, Prepare] = {
    "bound": _bound,  # the seed notebook, bound the way KAI's binder binds it
    "portion": _stored_by(("create",), _pod_with({"gpu-fraction": "0.5"})),
    "plain": _stored_by(("create",), _pod_with(None)),
    "applied": _stored_by(("apply",), _pod_with(APPLIED_MANIFEST)),
    "server-side": _stored_by(("apply", "--server-side"), _pod_with({"gpu-fraction": "0.5"})),
    "inference": _stored_by(("apply",), lambda name, ns: example("inference-sm-sharing.yaml", name, namespace=ns)),
    "absolute": _stored_by(("create",), _pod_with({NV + "gpu-memory.request": "8Gi", NV + "gpu-memory.limit": "16Gi",
                                                    NV + "gpu-compute.mode": "time-slicing"})),
    "sm-sharing-portion": _stored_by(("create",), _pod_with({"gpu-fraction": "0.5",
                                                              NV + "gpu-compute.mode": "sm-sharing"})),
}
SETUPS = tuple(_SETUPS)


def prepare(setup: str, users: Users, namespace: str, name: str) -> None:
    """Store the pod `setup` names (one of SETUPS) as `name`, as the users would; a refused step fails the test."""
    if setup not in _SETUPS:
        raise ValueError(f"no such setup: {setup!r} (one of {', '.join(SETUPS)})")
    for res in _SETUPS[setup](users, namespace, name):
        assert res.rc == 0, f"preparing the {setup!r} pod: {res.stderr.strip()}"


def _post_binding(kubectl: Callable[..., KubectlResult], namespace: str, name: str, annotations: dict[str, str],
                  dry: bool = False) -> KubectlResult:
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME}}
    path = f"/api/v1/namespaces/{namespace}/pods/{name}/binding" + ("?dryRun=All" if dry else "")
    return kubectl("create", "--raw", path, "-f", "-", input=json.dumps(body))


def _created(case_id: str, manifest: dict[str, Any], fragments: tuple[str, ...], **kw: Any) -> Case:
    """A CREATE by alice of `manifest` (named and placed by the target)."""
    def send(t: Target) -> KubectlResult:
        obj = copy.deepcopy(manifest)
        obj["metadata"].update(name=t.name, namespace=t.namespace)
        return t.users.alice("create", *t.dry_run, "-f", "-", "-o", "json", input=json.dumps(obj))
    return Case(case_id, send, fragments, manifest=manifest, **kw)


def _ptr(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _kubectl(who: str, *args: str) -> Send:
    """`kubectl <verb> pod <name> <args>`; args[0] is the verb."""
    verb, *rest = args
    return lambda t: t.users.by_name(who)(verb, *t.dry_run, "pod", t.name, *rest)


def _json_patch(who: str, ops: list[dict[str, Any]]) -> Send:
    return lambda t: t.users.by_name(who)("patch", *t.dry_run, "pod", t.name, "--type=json", "-p", json.dumps(ops))


def _merge_patch(who: str, patch: dict[str, Any], subresource: str = "", kind: str = "merge") -> Send:
    extra = [f"--subresource={subresource}"] if subresource else []
    return lambda t: t.users.by_name(who)("patch", *t.dry_run, "pod", t.name, *extra, f"--type={kind}", "-p",
                                          json.dumps(patch))


def _binding(who: str, annotations: dict[str, str]) -> Send:
    return lambda t: _post_binding(t.users.by_name(who), t.namespace, t.name, annotations, dry=t.dry)


def _apply(edit: dict[str, str | None]) -> Send:
    def send(t: Target) -> KubectlResult:
        annotations = {**APPLIED_MANIFEST}
        for key, value in edit.items():
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value
        manifest = pod(t.name, annotations, namespace=t.namespace)
        return t.users.alice("apply", *t.dry_run, "-f", "-", input=json.dumps(manifest))
    return send


def _server_side_apply_without_fraction(t: Target) -> KubectlResult:
    return t.users.alice("apply", *t.dry_run, "--server-side", "--force-conflicts", "-f", "-",
                         input=json.dumps(pod(t.name, {}, namespace=t.namespace)))


# ---- first written as tests/e2e/test_denials.py: a pod's values on CREATE -------------------------------------

def _deny(case_id: str, annotations: dict[str, str], *fragments: str, containers: list[dict[str, Any]] | None = None,
          unmutated: bool = False, **spec: Any) -> Case:
    return _created(case_id, pod(NEW_POD, annotations, containers, **spec), fragments, unmutated=unmutated)


_TWO = [{"name": "app", "image": IMAGE}, {"name": "sidecar", "image": "busybox:1.37"}]
_APP_WORKER = [{"name": "app", "image": IMAGE}, {"name": "worker", "image": IMAGE}]

DENIALS: list[Case] = [
    *(_deny(f"test_gpu_fraction_out_of_range_or_not_a_decimal[{v}]", {"gpu-fraction": v},
            f"annotation gpu-fraction: {v}", "strictly between 0 and 1")
      for v in ["1", "0", "-0.5", "1.5", "NaN", "half", "0x1p-1"]),
    _deny("test_portion_limit_without_gpu_fraction", {KAI_PORTION: "0.8"}, f"annotation {KAI_PORTION}: 0.8",
          "can only be used together with the gpu-fraction annotation"),
    *(_deny(f"test_portion_limit_not_above_fraction[{v}]", {"gpu-fraction": "0.5", KAI_PORTION: v},
            f"annotation {KAI_PORTION}: {v} must be greater than gpu-fraction (0.5) and less than 1")
      for v in ["0.4", "0.5"]),
    *(_deny(f"test_portion_limit_not_below_one[{v}]", {"gpu-fraction": "0.5", KAI_PORTION: v},
            f"annotation {KAI_PORTION}: {v} must be greater than gpu-fraction (0.5) and less than 1")
      for v in ["1", "1.2"]),
    _deny("test_shorthand_fraction_limit_below_fraction", {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.3"},
          "annotation gpu-fraction.limit: 0.3 must be greater than gpu-fraction (0.5) and less than 1"),
    *(_deny(f"test_gpu_memory_not_a_positive_integer[{v}]", {"gpu-memory": v},
            f"annotation gpu-memory: {v} must be a positive whole number of MiB") for v in ["abc", "0"]),
    _deny("test_gpu_memory_limit_without_unit", {"gpu-memory": "4096", "gpu-memory.limit": "8192"},
          "annotation gpu-memory.limit: 8192 must be a memory quantity with a unit"),
    _deny("test_gpu_memory_limit_below_gpu_memory", {"gpu-memory": "4096", "gpu-memory.limit": "2Gi"},
          "annotation gpu-memory.limit: 2Gi must not be smaller than gpu-memory (4096 MiB)"),
    *(_deny(f"test_memory_request_unparsable_not_positive_or_below_one_mib[{v}]", {NV + "gpu-memory.request": v},
            f"annotation {NV}gpu-memory.request: ", v, why)
      for v, why in [("lots", "must be a Kubernetes memory quantity of at least 1Mi"),
                     ("4 Gi", "must be a Kubernetes memory quantity"), ("0", "must be greater than 0"),
                     ("-1Gi", "must be greater than 0"), ("512Ki", "is below 1Mi")]),
    _deny("test_memory_limit_below_request", {NV + "gpu-memory.request": "40Gi", NV + "gpu-memory.limit": "20Gi"},
          f"annotation {NV}gpu-memory.limit: 20Gi must not be smaller than the request (40960 MiB)"),
    _deny("test_gpu_fraction_with_gpu_memory", {"gpu-fraction": "0.5", "gpu-memory": "4096"}, "gpu-memory",
          "cannot be used together with gpu-fraction"),
    _deny("test_gpu_fraction_with_user_written_memory_request",
          {"gpu-fraction": "0.5", NV + "gpu-memory.request": "10Gi"}, NV + "gpu-memory.request",
          "cannot be used together with gpu-fraction"),
    _deny("test_whole_gpu_limit_with_fraction", {"gpu-fraction": "0.5"},
          "container app: asks for whole GPUs (nvidia.com/gpu)",
          containers=[{"name": "app", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
          unmutated=True),
    *(_deny(f"test_num_devices_not_a_positive_integer[{v}]", {"gpu-fraction": "0.5", "gpu-fraction-num-devices": v},
            f"annotation gpu-fraction-num-devices: {v} must be a whole") for v in ["0", "x"]),
    _deny("test_num_devices_without_fraction", {"gpu-fraction-num-devices": "2"},
          "annotation gpu-fraction-num-devices: 2 needs a fraction to apply to"),
    _deny("test_key_names_a_missing_container", {"nvidia.com/container.trainer.gpu-memory.request": "20Gi"},
          "annotation nvidia.com/container.trainer.gpu-memory.request: names container trainer, but the pod has "
          "app, sidecar", containers=_TWO),
    _deny("test_malformed_key_under_our_prefix", {"nvidia.com/container.app.gpu-memory": "20Gi"},
          "annotation nvidia.com/container.app.gpu-memory: is not a key gpufrac knows: expected "
          "nvidia.com/container.<container>."),
    _deny("test_unknown_compute_mode", {NV + "gpu-memory.request": "8Gi", NV + "gpu-compute.mode": "turbo"},
          f"annotation {NV}gpu-compute.mode: turbo must be time-slicing or sm-sharing"),
    _deny("test_mode_on_a_container_without_request", {NV + "gpu-compute.mode": "sm-sharing"},
          f"annotation {NV}gpu-compute.mode: sm-sharing needs a GPU memory request for container app"),
    # KAI reads a portion limit as the first container's unless gpu-fraction-container-name says otherwise.
    *(_deny(f"test_portion_limit_of_a_container_other_than_the_first_needs_its_name[{key}]",
            {"gpu-fraction": "0.5", key: "0.8", "nvidia.com/container.worker.gpu-compute.mode": "time-slicing"},
            key, "0.8", "first container's (app)", "set gpu-fraction-container-name to worker", containers=_APP_WORKER)
      for key in ["gpu-fraction.limit", "kai.scheduler/container.worker.gpu-memory.portion.limit"]),
    _deny("test_two_containers_with_different_modes",
          {NV + "gpu-memory.request": "8Gi", NV + "gpu-compute.mode": "sm-sharing",
           "nvidia.com/container.worker.gpu-memory.request": "8Gi",
           "nvidia.com/container.worker.gpu-compute.mode": "time-slicing"},
          "pod: mixes compute modes across containers (app=sm-sharing, worker=time-slicing)", containers=_APP_WORKER),
    _deny("test_privileged_fractional_container", {"gpu-fraction": "0.25"}, "container app: is privileged",
          containers=[{"name": "app", "image": IMAGE, "securityContext": {"privileged": True}}],
          unmutated=True),
    _deny("test_user_sets_devices_on_create", {"gpu-fraction": "0.5", DEVICES: "GPU-a"}, f"annotation {DEVICES}"),
]

# ---- first written as tests/e2e/test_escapes.py: ways out of a fraction, on UPDATE, binding and CREATE ---------


def _bound_edit(verb: str, key: str, value: str | None) -> Send:
    if verb == "annotate":
        return _kubectl("alice", "annotate", "--overwrite", f"{key}={value}")
    op: dict[str, Any] = {"op": verb.removeprefix("json-"), "path": f"/metadata/annotations/{_ptr(key)}"}
    if value is not None:
        op["value"] = value
    return _json_patch("alice", [op])


_BOUND_EDITS = [
    ("json-remove", DEVICES, None, "remove-devices"),
    ("json-replace", DEVICES, "GPU-c,GPU-d", "replace-devices"),
    ("json-remove", NV + "gpu-memory.request", None, "remove-bind-request"),
    ("annotate", NV + "gpu-memory.limit", "140000Mi", "raise-bind-limit"),
    ("json-remove", NV + "gpu-compute.mode", None, "remove-mode"),
    ("json-remove", KAI_PORTION, None, "remove-portion-limit"),
    ("annotate", KAI_PORTION, "0.99", "raise-portion-limit"),
    ("annotate", "gpu-fraction", "0.9", "raise-gpu-fraction"),
    ("json-remove", "gpu-fraction", None, "remove-gpu-fraction"),
    ("annotate", C + "gpu-memory.limit-mib", "143770", "raise-canonical-limit-mib"),
    ("annotate", C + "mps-pinned-mem-limit", "0=143770M,1=143770M", "raise-pinned-limit"),
    ("json-remove", C + "mps-pinned-mem-limit", None, "remove-pinned-limit"),
    ("annotate", C + "compute-mode", "sm-sharing", "change-canonical-mode"),
    ("annotate", "gpufrac.io/unlimited", "true", "add-own-gpufrac-key"),
]


def _remove_everything(t: Target) -> KubectlResult:
    """One JSON patch without any fraction key or the label: only the matchConditions' look at oldObject sends it
    to the webhook."""
    stored = json.loads(t.users.admin("get", "pod", t.name, "-o", "json").stdout)
    keys = [k for k in stored["metadata"]["annotations"]
            if k.startswith(("nvidia.com/", "kai.scheduler/", "gpufrac.io/", "gpu-"))]
    assert {DEVICES, C + "compute-mode", "gpu-fraction"} <= set(keys), keys
    ops = [{"op": "remove", "path": f"/metadata/annotations/{_ptr(k)}"} for k in keys]
    ops.append({"op": "remove", "path": f"/metadata/labels/{_ptr(LABEL)}"})
    return t.users.alice("patch", *t.dry_run, "pod", t.name, "--type=json", "-p", json.dumps(ops))


def _escape_create(case_id: str, annotations: dict[str, str], labels: dict[str, str], *fragments: str,
                   unmutated: bool = False) -> Case:
    manifest = pod(NEW_POD, annotations, [{"name": "app", "image": IMAGE}, {"name": "side", "image": "busybox:1.37"}])
    manifest["metadata"]["labels"] = labels
    return _created(case_id, manifest, fragments, unmutated=unmutated)


def _with(annotations: dict[str, str], containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return pod(NEW_POD, annotations, containers, **spec)


_CUDA = {"name": "app", "image": IMAGE}


def _beside(where: str, container: dict[str, Any]) -> dict[str, Any]:
    """A fractional pod with `container` beside its fractional one: a sidecar, or an init container."""
    if where == "sidecar":
        return _with({"gpu-fraction": "0.5"}, [dict(_CUDA), {"name": "side", **container}])
    return _with({"gpu-fraction": "0.5"}, [dict(_CUDA)], initContainers=[{"name": "setup", **container}])


def _env_case(param: str, where: str, env: list[dict[str, Any]], fragment: str) -> Case:
    manifest = _beside(where, {"image": "busybox:1.37", "env": env})
    return _created(f"test_container_beside_a_fraction_sets_gpu_env[{param}]", manifest,
                    (f"container {'side' if where == 'sidecar' else 'setup'}", fragment), unmutated=True)


def _mount_case(param: str, path: str | None) -> Case:
    """A sidecar of a fractional pod mounting the injected MPS volume (path None), or a hostPath of its own."""
    fragment = "mounts the time-slicing MPS directory" if path is None else "volume mine: mounts"
    manifest = _with({"gpu-fraction": "0.5"}, [dict(_CUDA)])
    if path is None:
        manifest["spec"]["containers"].append({"name": "side", "image": "busybox:1.37",
                                               "volumeMounts": [{"name": TS_VOLUME, "mountPath": "/mps"}]})
    else:
        manifest["spec"]["volumes"] = [{"name": "mine", "hostPath": {"path": path}}]
        manifest["spec"]["containers"].append({"name": "side", "image": "busybox:1.37",
                                               "volumeMounts": [{"name": "mine", "mountPath": "/mps"}]})
    return _created(f"test_sidecar_reaches_the_mps_directories[{param}]", manifest, (fragment,),
                    webhook_only=_NORMALIZED if "//" in (path or "") else "", unmutated=True,
                    invalid_unmutated=path is None)


def _ephemeral(dbg: dict[str, Any]) -> Send:
    return _merge_patch("alice", {"spec": {"ephemeralContainers": [dbg]}}, "ephemeralcontainers", "strategic")


def _kubectl_debug(ephemeral: dict[str, Any], *args: str) -> Send:
    """`kubectl debug` as alice types it; as a dry run (which kubectl debug has not), the patch it sends."""
    dry = _ephemeral({"name": "dbg", "image": "busybox:1.37", "targetContainerName": "app", **ephemeral})

    def send(t: Target) -> KubectlResult:
        if t.dry:
            return dry(t)
        return t.users.alice("debug", f"pod/{t.name}", "--image=busybox:1.37", "--target=app", "--profile=general",
                             *args)
    return send


def _debug(param: str, env: str, fragment: str) -> Case:
    name, _, value = env.partition("=")
    return Case(f"test_kubectl_debug_with_gpu_env_is_denied[{param}]",
                _kubectl_debug({"env": [{"name": name, "value": value}]}, f"--env={env}"),
                ("ephemeral container", fragment), setup="portion")


def _debug_custom_mount(t: Target) -> KubectlResult:
    custom = {"volumeMounts": [{"name": TS_VOLUME, "mountPath": "/mps"}]}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as spec:
        json.dump(custom, spec)
        spec.flush()
        return _kubectl_debug(custom, f"--custom={spec.name}")(t)


def _raw_ephemeral(param: str, spec: dict[str, Any], fragment: str) -> Case:
    dbg = {"name": "dbg", "image": "busybox:1.37", "targetContainerName": "app", **spec}
    return Case(f"test_raw_ephemeralcontainers_patch_is_denied[{param}]", _ephemeral(dbg),
                ("ephemeral container dbg", fragment), setup="bound")


_FIELDREF = {"fieldRef": {"fieldPath": f"metadata.annotations['{DEVICES}']"}}
_WHOLE = {"image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "1"}}}

ESCAPES: list[Case] = [
    *(Case(f"test_user_edits_a_fraction_annotation_of_a_bound_pod[{i}]", _bound_edit(verb, key, value), (key,),
           setup="bound") for verb, key, value, i in _BOUND_EDITS),
    Case("test_user_removes_or_changes_the_fractional_label[remove]", _kubectl("alice", "label", f"{LABEL}-"),
         (f"label {LABEL}",), setup="bound"),
    Case("test_user_removes_or_changes_the_fractional_label[set-false]",
         _kubectl("alice", "label", "--overwrite", f"{LABEL}=false"), (f"label {LABEL}",), setup="bound"),
    Case("test_one_json_patch_removing_every_fraction_key_and_the_label_is_still_reviewed", _remove_everything,
         (DEVICES, "gpu-fraction", f"label {LABEL}", "was removed"), setup="bound"),
    Case("test_the_scheduler_cannot_change_or_remove_devices_after_bind[change]",
         _kubectl("binder", "annotate", "--overwrite", f"{DEVICES}=GPU-c,GPU-d"), (DEVICES, "was changed"),
         setup="bound"),
    Case("test_the_scheduler_cannot_change_or_remove_devices_after_bind[remove]",
         _kubectl("binder", "annotate", f"{DEVICES}-"), (DEVICES, "was removed"), setup="bound"),
    # A CDI name for every GPU (NVIDIA's spec has `nvidia.com/gpu=all`) would hand the fraction the whole node.
    Case("test_the_scheduler_cannot_bind_a_fraction_to_every_gpu",
         _kubectl("binder", "annotate", f"{DEVICES}=nvidia.com/gpu=all", f"{NV}gpu-memory.request=70Gi",
                  f"{NV}gpu-memory.limit=70Gi"), (DEVICES, "nvidia.com/gpu=all", "never a name for all GPUs"),
         setup="portion"),
    # system:masters skips RBAC, not admission: a cluster admin is not the scheduler either.
    Case("test_admin_is_no_exception", _kubectl("admin", "annotate", "--overwrite", f"{DEVICES}=GPU-z"), (DEVICES,),
         setup="bound"),
    # The chart's ValidatingAdmissionPolicy judges pods/status (the webhook does not, so an outage never blocks it).
    Case("test_fraction_annotations_cannot_change_through_pods_status",
         _merge_patch("admin", {"metadata": {"annotations": {DEVICES: "GPU-a,GPU-b,GPU-c,GPU-d",
                                                             C + "gpu-memory.limit-mib": "143770"},
                                             "labels": {LABEL: None}}}, "status"), (DEVICES,), setup="bound",
         denied_by="ValidatingAdmissionPolicy 'gpufrac-pods-status'"),
    *(Case(f"test_user_applies_an_edited_manifest[{i}]", _apply(edit), (key,), setup="applied") for edit, key, i in [
        ({"gpu-fraction.limit": None}, "gpu-fraction.limit", "remove-shorthand-limit"),
        ({"gpu-fraction": "0.9", "gpu-fraction.limit": "0.95"}, "gpu-fraction", "raise-fraction"),
        ({NV + "gpu-compute.mode": "sm-sharing"}, NV + "gpu-compute.mode", "set-mode"),
        ({DEVICES: "GPU-a"}, DEVICES, "set-devices"),
        ({NV + "gpu-memory.limit": "80Gi"}, NV + "gpu-memory.limit", "set-bind-limit"),
        ({C + "gpu-memory.limit-mib": "81920"}, C + "gpu-memory.limit-mib", "set-canonical-mib"),
    ]),
    Case("test_user_server_side_applies_a_manifest_without_the_fraction", _server_side_apply_without_fraction,
         ("gpu-fraction", "was removed"), setup="server-side"),
    *(Case(f"test_user_adds_bind_time_values_to_a_portion_pod[{i}]",
           _json_patch("alice", [{"op": "add", "path": f"/metadata/annotations/{_ptr(key)}", "value": value}]),
           (key, fragment), setup="portion") for key, value, fragment, i in [
        (NV + "gpu-memory.request", "70Gi", "only the scheduler may add it", "bind-request"),
        (NV + "gpu-memory.limit", "140Gi", "only the scheduler may add it", "bind-limit"),
        (DEVICES, "GPU-a", "only the scheduler may add it", "devices"),
        (KAI_PORTION, "0.9", "cannot be added", "portion-limit"),
    ]),
    *(Case(f"test_user_turns_a_plain_pod_fractional_after_create[{i}]", _kubectl("alice", *args), (fragment,),
           setup="plain") for args, fragment, i in [
        (["annotate", "gpu-fraction=0.5"], "annotation gpu-fraction", "gpu-fraction"),
        (["annotate", f"{NV}gpu-memory.request=8Gi"], NV + "gpu-memory.request", "memory-request"),
        (["annotate", f"{DEVICES}=GPU-a"], DEVICES, "devices"),
        (["annotate", f"{C}compute-mode=sm-sharing"], C + "compute-mode", "canonical"),
        (["label", f"{LABEL}=true"], f"label {LABEL}", "label"),
    ]),
    _escape_create("test_user_creates_a_pod_with_what_only_gpufrac_or_the_scheduler_writes[own-key-on-fractional]",
                   {"gpu-fraction": "0.5", "gpufrac.io/unlimited": "true"}, {}, "gpufrac.io/unlimited"),
    _escape_create("test_user_creates_a_pod_with_what_only_gpufrac_or_the_scheduler_writes[canonical-on-plain]",
                   {C + "compute-mode": "sm-sharing"}, {}, C + "compute-mode"),
    _escape_create("test_user_creates_a_pod_with_what_only_gpufrac_or_the_scheduler_writes[label-on-plain]",
                   {}, {LABEL: "true"}, f"label {LABEL}: is only for pods with GPU fractions"),
    _escape_create("test_user_creates_a_pod_with_what_only_gpufrac_or_the_scheduler_writes[devices-absolute]",
                   {NV + "gpu-memory.request": "8Gi", DEVICES: "GPU-a"}, {}, DEVICES, unmutated=True),
    _escape_create("test_user_creates_a_pod_with_what_only_gpufrac_or_the_scheduler_writes[devices-for-sidecar]",
                   {"gpu-fraction": "0.5", "nvidia.com/container.side.gpus.devices": "GPU-a"}, {},
                   "nvidia.com/container.side.gpus.devices"),
    _escape_create("test_user_creates_a_pod_with_what_only_gpufrac_or_the_scheduler_writes[bind-limit-on-portion]",
                   {"gpu-fraction": "0.5", NV + "gpu-memory.limit": "80Gi"}, {}, NV + "gpu-memory.limit"),
    *(Case(f"test_fraction_keys_cannot_ride_a_binding[{i}]", _binding(who, annotations), (key, "Binding"),
           setup="portion") for who, annotations, key, i in [
        ("alice", {DEVICES: "GPU-a"}, DEVICES, "alice-devices"),
        ("alice", {C + "gpu-memory.limit-mib": "143770"}, C + "gpu-memory.limit-mib", "alice-canonical"),
        ("binder", {DEVICES: "GPU-a"}, DEVICES, "binder-devices"),
        ("binder", {NV + "gpu-memory.limit": "140Gi"}, NV + "gpu-memory.limit", "binder-bind-limit"),
        ("binder", {"gpufrac.io/unlimited": "true", "example.com/x": "y"}, "gpufrac.io/unlimited", "binder-own-key"),
        ("binder", {"gpu-fraction": "0.9"}, "gpu-fraction", "binder-shorthand"),
    ]),
    *(_env_case(i, where, env, fragment) for i, where, env, fragment in [
        ("sidecar-all", "sidecar", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}], "NVIDIA_VISIBLE_DEVICES"),
        ("sidecar-uuid", "sidecar", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-a"}], "NVIDIA_VISIBLE_DEVICES"),
        ("sidecar-duplicate-last-wins", "sidecar", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
                                                    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}],
         "NVIDIA_VISIBLE_DEVICES"),
        ("sidecar-fieldref", "sidecar", [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": _FIELDREF}],
         "NVIDIA_VISIBLE_DEVICES"),
        ("init-all", "init", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}], "NVIDIA_VISIBLE_DEVICES"),
        ("sidecar-mps-pipe", "sidecar", [{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": TS_DIR}],
         "CUDA_MPS_PIPE_DIRECTORY"),
        ("sidecar-mps-threads", "sidecar", [{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"}],
         "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
        ("init-memory-limit", "init", [{"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": "143770"}],
         "NVIDIA_GPU_MEMORY_LIMIT"),
        ("init-pinned-limit", "init", [{"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=143770M"}],
         "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
    ]),
    *(_mount_case(i, path) for i, path in [
        ("sidecar-mounts-injected-volume", None), ("own-volume-same-dir", TS_DIR), ("gpufrac-root", "/run/gpufrac"),
        ("mps-root", "/run/gpufrac/mps"), ("other-mode-dir", "/run/gpufrac/mps/sm-sharing"),
        ("unnormalized-path", "/run//gpufrac/mps/./time-slicing/"), ("parent-run", "/run"), ("host-root", "/"),
        ("var-run-alias", "/var/run/gpufrac/mps/time-slicing"), ("var-run-parent", "/var/run"),
    ]),
    _created("test_sidecar_with_its_own_volume_of_gpufracs_csi_driver_is_denied",
             _with({"gpu-fraction": "0.5"},
                   [dict(_CUDA), {"name": "side", "image": "busybox:1.37",
                                  "volumeMounts": [{"name": "mine", "mountPath": "/mps"}]}],
                   volumes=[{"name": "mine", "csi": {"driver": "mps.gpufrac.io",
                                                     "volumeAttributes": {"mode": "sm-sharing"}}}]),
             ("volume mine", "uses gpufrac's CSI driver mps.gpufrac.io"), unmutated=True),
    _created("test_fractional_container_mounts_the_other_modes_directory",
             _with({"gpu-fraction": "0.5"},
                   [{"name": "app", "image": IMAGE, "volumeMounts": [{"name": "sm", "mountPath": "/sm"}]}],
                   volumes=[{"name": "sm", "hostPath": {"path": "/run/gpufrac/mps/sm-sharing"}}]),
             ("volume sm", "/run/gpufrac/mps/sm-sharing"), unmutated=True),
    *(_debug(i, env, fragment) for i, env, fragment in [
        ("visible-all", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES"),
        ("visible-uuid", "NVIDIA_VISIBLE_DEVICES=GPU-a", "NVIDIA_VISIBLE_DEVICES"),
        ("mps-pipe", f"CUDA_MPS_PIPE_DIRECTORY={TS_DIR}", "CUDA_MPS_PIPE_DIRECTORY"),
        ("memory-limit", "NVIDIA_GPU_MEMORY_LIMIT=143770", "NVIDIA_GPU_MEMORY_LIMIT"),
    ]),
    Case("test_kubectl_debug_custom_mount_of_the_mps_volume_is_denied", _debug_custom_mount,
         ("ephemeral container", "mounts the time-slicing MPS directory"), setup="portion"),
    *(_raw_ephemeral(i, spec, fragment) for i, spec, fragment in [
        ("fieldref-devices", {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": _FIELDREF}]},
         "NVIDIA_VISIBLE_DEVICES"),
        ("duplicate-env", {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"},
                                   {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}, "NVIDIA_VISIBLE_DEVICES"),
        ("mps-volume", {"volumeMounts": [{"name": TS_VOLUME, "mountPath": "/mps"}]},
         "mounts the time-slicing MPS directory"),
        ("pinned-limit", {"env": [{"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=1G"}]},
         "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
    ]),
    *(_created(f"test_fractional_container_with_privileges[{i}]",
               _with({"gpu-fraction": "0.5"}, [{"name": "app", "image": IMAGE, "securityContext": sc}]),
               (f"container app: {fragment}",), unmutated=True) for sc, fragment, i in [
        ({"capabilities": {"add": ["SYS_ADMIN"]}}, "adds SYS_ADMIN", "sys-admin"),
        ({"capabilities": {"add": ["NET_ADMIN", "CAP_SYS_ADMIN"]}}, "adds CAP_SYS_ADMIN", "cap-sys-admin"),
        ({"capabilities": {"add": ["ALL"]}}, "adds ALL", "all-capabilities"),
        ({"capabilities": {"add": ["sys_admin"]}}, "adds sys_admin", "lowercase-sys-admin"),
        ({"privileged": True}, "is privileged", "privileged"),
    ]),
    # A fraction on an init container (gpu-fraction-container-name) is held to the same rules.
    _created("test_fractional_init_container_privileged",
             _with({"gpu-fraction": "0.5", "gpu-fraction-container-name": "setup"},
                   [{"name": "main", "image": "busybox:1.37"}],
                   initContainers=[{"name": "setup", "image": IMAGE, "securityContext": {"privileged": True}}]),
             ("container setup", "privileged"), unmutated=True),
    *(_created(f"test_fractional_pod_shares_host_namespaces[{f}]",
               _with({NV + "gpu-memory.request": "8Gi"}, [dict(_CUDA)], **{f: True}), (f"pod: sets {f}: true",),
               unmutated=True) for f in ["hostPID", "hostIPC"]),
    *(_created(f"test_whole_gpus_beside_a_fraction[{where}]", _beside(where, dict(_WHOLE)),
               (f"container {'side' if where == 'sidecar' else 'setup'}", "nvidia.com/gpu"), unmutated=True)
      for where in ["sidecar", "init"]),
]

# ---- first written as tests/e2e/test_bind_and_updates.py and test_kai_e2e.py: after bind, and KAI's keys -------

_KAI_TARGETS = [{"name": "main", "image": IMAGE}, {"name": "helper", "image": IMAGE}]


def _bad_portion(portion: str) -> Send:
    return _merge_patch("binder", {"metadata": {"annotations": {
        NV + "gpus.devices": "GPU-a", NV + "gpu-memory.request": "1000Mi", NV + "gpu-compute.portion": portion}}})


AFTER_BIND: list[Case] = [
    # The scheduler adds bind-time values; it may not rewrite the request the user asked for.
    Case("test_binder_cannot_change_a_users_memory_request",
         _kubectl("binder", "annotate", "--overwrite", f"{NV}gpu-memory.request=50Gi"), (NV + "gpu-memory.request",),
         setup="inference"),
    Case("test_alice_cannot_change_a_limit", _kubectl("alice", "annotate", "--overwrite", f"{NV}gpu-memory.limit=32Gi"),
         (NV + "gpu-memory.limit",), setup="absolute"),
    Case("test_alice_cannot_change_the_mode",
         _kubectl("alice", "annotate", "--overwrite", f"{NV}gpu-compute.mode=sm-sharing"), (NV + "gpu-compute.mode",),
         setup="absolute"),
    _created("test_a_container_name_the_keys_contradict_is_denied",
             pod(NEW_POD, {"gpu-memory": "2000", "gpu-fraction-container-name": "main",
                           "nvidia.com/container.helper.gpu-memory.request": "2000Mi"}, _KAI_TARGETS),
             ("nvidia.com/container.helper.gpu-memory.request", "gpu-fraction-container-name is main")),
    *(Case(f"test_a_bad_compute_portion_is_denied_at_bind[{portion}]", _bad_portion(portion),
           (NV + "gpu-compute.portion", f": {portion} must be a decimal number greater than 0 and at most 1"),
           setup="sm-sharing-portion") for portion in ["50", "0"]),
    # The pod KAI v0.17's gpusharing admission leaves (testkit/kai_oracle.py: its Mutate, from its source).
    _created("test_the_pod_kai_v017s_admission_leaves_is_denied_with_the_kai_setting_to_change",
             kai_v017_mutate(pod(NEW_POD, {"gpu-fraction": "0.5"})),
             (SHARED_GPU_CONFIGMAP, "older GPU-sharing mode", "global.gpuSharingMode=NvFractions",
              "global.gpuSharing=false"), unsaid=("did not run or its changes were undone",), unmutated=True),
]

CORPUS: list[Case] = DENIALS + ESCAPES + AFTER_BIND

# What tests/e2e/test_denials.py and test_escapes.py check that is not a refusal of one request (what must still
# work, or the example files), so not a case here.
NOT_DENIALS = {
    "test_wrong_examples_are_denied",  # examples/wrong-*.yaml: the same rules, as files (make demo)
    "test_users_canonical_values_on_create_are_replaced_not_kept",
    "test_a_plain_binding_by_the_scheduler_still_binds",
    "test_debug_container_without_env_gets_no_gpu",
}
