"""The denial cases of tests/e2e/test_denials.py and test_escapes.py as data: what each sends, against which prepared
pod, so tests/e2e/test_admission_policies.py can send every one of them to the real API server with the webhook,
with the ValidatingAdmissionPolicies, and with both. Every request is a server-side dry run: one prepared pod serves
every case and every engine.

`webhook_only` says why the policies are not expected to deny a case with its message (docs/admission-policies.md);
tests/e2e/test_admission_policies.py checks each test of the two files is here (by its name) or listed in NOT_DENIALS.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from e2e.kubectl import KubectlResult
from e2e.names import NODE_NAME, USER_NAMESPACE
from e2e.testing import pod
from testkit.pods import IMAGE

NV = "nvidia.com/container.app."
KAI_PORTION = "kai.scheduler/container.app.gpu-memory.portion.limit"
C = "gpufrac.io/container.app."
LABEL = "gpufrac.io/fractional"
DEVICES = NV + "gpus.devices"
TS_VOLUME = "gpufrac-mps-time-slicing"
TS_DIR = "/run/gpufrac/mps/time-slicing"
DRY = "--dry-run=server"

# The pods the UPDATE cases edit, prepared once (with the webhook up): setup name -> pod name.
SETUPS = ("bound", "portion", "plain", "applied", "server-side")
APPLIED_MANIFEST = {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.6"}

_NORMALIZED = "a hostPath written other than plainly needs the node's path normalization (CEL has none)"

Send = Callable[["Users", str], KubectlResult]


@dataclass(frozen=True)
class Users:
    alice: Callable[..., KubectlResult]
    binder: Callable[..., KubectlResult]
    admin: Callable[..., KubectlResult]

    def by_name(self, who: str) -> Callable[..., KubectlResult]:
        return {"alice": self.alice, "binder": self.binder, "admin": self.admin}[who]


@dataclass(frozen=True)
class Case:
    id: str  # the test it comes from, [its parameters]
    send: Send  # given the users and the prepared pod's name
    fragments: tuple[str, ...]
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

    @property
    def source(self) -> str:
        return self.id.partition("[")[0]


def _create(obj: dict[str, Any], who: str = "alice") -> Send:
    return lambda users, _: users.by_name(who)("create", DRY, "-f", "-", "-o", "json", input=json.dumps(obj))


def _ptr(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _kubectl(who: str, *args: str) -> Send:
    """`kubectl <verb> pod <name> <args>`; args[0] is the verb."""
    verb, *rest = args
    return lambda users, name: users.by_name(who)(verb, DRY, "pod", name, *rest)


def _json_patch(who: str, ops: list[dict[str, Any]] | Callable[[str], list[dict[str, Any]]],
                subresource: str = "") -> Send:
    def send(users: Users, name: str) -> KubectlResult:
        body = ops(name) if callable(ops) else ops
        extra = [f"--subresource={subresource}"] if subresource else []
        return users.by_name(who)("patch", DRY, "pod", name, *extra, "--type=json", "-p", json.dumps(body))
    return send


def _merge_patch(who: str, patch: dict[str, Any], subresource: str = "", kind: str = "merge") -> Send:
    extra = [f"--subresource={subresource}"] if subresource else []
    return lambda users, name: users.by_name(who)("patch", DRY, "pod", name, *extra, f"--type={kind}", "-p",
                                                  json.dumps(patch))


def _binding(who: str, annotations: dict[str, str]) -> Send:
    def send(users: Users, name: str) -> KubectlResult:
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "annotations": annotations},
                "target": {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME}}
        path = f"/api/v1/namespaces/{USER_NAMESPACE}/pods/{name}/binding?dryRun=All"
        return users.by_name(who)("create", "--raw", path, "-f", "-", input=json.dumps(body))
    return send


def _apply(edit: dict[str, str | None]) -> Send:
    def send(users: Users, name: str) -> KubectlResult:
        annotations = {**APPLIED_MANIFEST}
        for key, value in edit.items():
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value
        return users.alice("apply", DRY, "-f", "-", input=json.dumps(pod(name, annotations)))
    return send


def _server_side_apply_without_fraction(users: Users, name: str) -> KubectlResult:
    return users.alice("apply", DRY, "--server-side", "--force-conflicts", "-f", "-",
                       input=json.dumps(pod(name, {})))


# ---- tests/e2e/test_denials.py -------------------------------------------------------------------------------

def _deny(case_id: str, annotations: dict[str, str], *fragments: str, containers: list[dict[str, Any]] | None = None,
          unmutated: bool = False, **spec: Any) -> Case:
    return Case(case_id, _create(pod("corpus", annotations, containers, **spec)), fragments, unmutated=unmutated)


_TWO = [{"name": "app", "image": IMAGE}, {"name": "sidecar", "image": "busybox:1.37"}]
_APP_WORKER = [{"name": "app", "image": IMAGE}, {"name": "worker", "image": IMAGE}]

DENIALS: list[Case] = [
    *(_deny(f"test_gpu_fraction_out_of_range_or_not_a_decimal[{v}]", {"gpu-fraction": v}, "gpu-fraction", v)
      for v in ["1", "0", "-0.5", "1.5", "NaN", "half", "0x1p-1"]),
    _deny("test_portion_limit_without_gpu_fraction", {KAI_PORTION: "0.8"}, KAI_PORTION, "0.8"),
    *(_deny(f"test_portion_limit_not_above_fraction[{v}]", {"gpu-fraction": "0.5", KAI_PORTION: v}, KAI_PORTION, v)
      for v in ["0.4", "0.5"]),
    *(_deny(f"test_portion_limit_not_below_one[{v}]", {"gpu-fraction": "0.5", KAI_PORTION: v}, KAI_PORTION, v)
      for v in ["1", "1.2"]),
    _deny("test_shorthand_fraction_limit_below_fraction", {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.3"},
          "gpu-fraction.limit", "0.3"),
    *(_deny(f"test_gpu_memory_not_a_positive_integer[{v}]", {"gpu-memory": v}, "gpu-memory", v) for v in ["abc", "0"]),
    _deny("test_gpu_memory_limit_without_unit", {"gpu-memory": "4096", "gpu-memory.limit": "8192"},
          "gpu-memory.limit", "8192"),
    _deny("test_gpu_memory_limit_below_gpu_memory", {"gpu-memory": "4096", "gpu-memory.limit": "2Gi"},
          "gpu-memory.limit", "2Gi"),
    *(_deny(f"test_memory_request_unparsable_not_positive_or_below_one_mib[{v}]", {NV + "gpu-memory.request": v},
            NV + "gpu-memory.request", v) for v in ["lots", "4 Gi", "0", "-1Gi", "512Ki"]),
    _deny("test_memory_limit_below_request", {NV + "gpu-memory.request": "40Gi", NV + "gpu-memory.limit": "20Gi"},
          NV + "gpu-memory.limit", "20Gi"),
    _deny("test_gpu_fraction_with_gpu_memory", {"gpu-fraction": "0.5", "gpu-memory": "4096"}, "gpu-fraction",
          "gpu-memory"),
    _deny("test_gpu_fraction_with_user_written_memory_request",
          {"gpu-fraction": "0.5", NV + "gpu-memory.request": "10Gi"},
          "gpu-fraction", NV + "gpu-memory.request"),
    _deny("test_whole_gpu_limit_with_fraction", {"gpu-fraction": "0.5"}, "nvidia.com/gpu",
          containers=[{"name": "app", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
          unmutated=True),
    *(_deny(f"test_num_devices_not_a_positive_integer[{v}]", {"gpu-fraction": "0.5", "gpu-fraction-num-devices": v},
            "gpu-fraction-num-devices", v) for v in ["0", "x"]),
    _deny("test_num_devices_without_fraction", {"gpu-fraction-num-devices": "2"}, "gpu-fraction-num-devices"),
    _deny("test_key_names_a_missing_container", {"nvidia.com/container.trainer.gpu-memory.request": "20Gi"},
          "nvidia.com/container.trainer.gpu-memory.request", containers=_TWO),
    _deny("test_malformed_key_under_our_prefix", {"nvidia.com/container.app.gpu-memory": "20Gi"},
          "nvidia.com/container.app.gpu-memory"),
    _deny("test_unknown_compute_mode", {NV + "gpu-memory.request": "8Gi", NV + "gpu-compute.mode": "turbo"},
          NV + "gpu-compute.mode", "turbo"),
    _deny("test_mode_on_a_container_without_request", {NV + "gpu-compute.mode": "sm-sharing"}, NV + "gpu-compute.mode"),
    *(_deny(f"test_portion_limit_of_a_container_other_than_the_first_needs_its_name[{key}]",
            {"gpu-fraction": "0.5", key: "0.8", "nvidia.com/container.worker.gpu-compute.mode": "time-slicing"},
            key, "0.8", containers=_APP_WORKER)
      for key in ["gpu-fraction.limit", "kai.scheduler/container.worker.gpu-memory.portion.limit"]),
    _deny("test_two_containers_with_different_modes",
          {NV + "gpu-memory.request": "8Gi", NV + "gpu-compute.mode": "sm-sharing",
           "nvidia.com/container.worker.gpu-memory.request": "8Gi",
           "nvidia.com/container.worker.gpu-compute.mode": "time-slicing"},
          "sm-sharing", "time-slicing", containers=_APP_WORKER),
    _deny("test_privileged_fractional_container", {"gpu-fraction": "0.25"}, "privileged",
          containers=[{"name": "app", "image": IMAGE, "securityContext": {"privileged": True}}],
          unmutated=True),
    _deny("test_user_sets_devices_on_create", {"gpu-fraction": "0.5", DEVICES: "GPU-a"}, DEVICES),
]

# ---- tests/e2e/test_escapes.py -------------------------------------------------------------------------------


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


def _remove_everything(users: Users, name: str) -> KubectlResult:
    stored = json.loads(users.admin("get", "pod", name, "-n", USER_NAMESPACE, "-o", "json").stdout)
    keys = [k for k in stored["metadata"]["annotations"]
            if k.startswith(("nvidia.com/", "kai.scheduler/", "gpufrac.io/", "gpu-"))]
    ops = [{"op": "remove", "path": f"/metadata/annotations/{_ptr(k)}"} for k in keys]
    ops.append({"op": "remove", "path": f"/metadata/labels/{_ptr(LABEL)}"})
    return users.alice("patch", DRY, "pod", name, "--type=json", "-p", json.dumps(ops))


def _escape_create(case_id: str, annotations: dict[str, str], labels: dict[str, str], *fragments: str,
                   unmutated: bool = False) -> Case:
    manifest = pod("corpus", annotations, [{"name": "app", "image": IMAGE}, {"name": "side", "image": "busybox:1.37"}])
    manifest["metadata"]["labels"] = labels
    return Case(case_id, _create(manifest), fragments, unmutated=unmutated)


def _with(annotations: dict[str, str], containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return pod("corpus", annotations, containers, **spec)


_CUDA = {"name": "app", "image": IMAGE}


def _env_case(param: str, where: str, env: list[dict[str, Any]], fragment: str) -> Case:
    manifest = _with({"gpu-fraction": "0.5"}, [dict(_CUDA)])
    if where == "sidecar":
        manifest["spec"]["containers"].append({"name": "side", "image": "busybox:1.37", "env": env})
    else:
        manifest["spec"]["initContainers"] = [{"name": "setup", "image": "busybox:1.37", "env": env}]
    return Case(f"test_container_beside_a_fraction_sets_gpu_env[{param}]", _create(manifest), (fragment,),
                unmutated=True)


def _mount_case(param: str, path: str | None, fragment: str) -> Case:
    manifest = _with({"gpu-fraction": "0.5"}, [dict(_CUDA)])
    if path is None:
        manifest["spec"]["containers"].append({"name": "side", "image": "busybox:1.37",
                                               "volumeMounts": [{"name": TS_VOLUME, "mountPath": "/mps"}]})
    else:
        manifest["spec"]["volumes"] = [{"name": "mine", "hostPath": {"path": path}}]
        manifest["spec"]["containers"].append({"name": "side", "image": "busybox:1.37",
                                               "volumeMounts": [{"name": "mine", "mountPath": "/mps"}]})
    return Case(f"test_sidecar_reaches_the_mps_directories[{param}]", _create(manifest), (fragment,),
                webhook_only=_NORMALIZED if "//" in (path or "") else "", unmutated=True,
                invalid_unmutated=path is None)


def _debug(param: str, env: str, fragment: str) -> Case:
    dbg = {"name": "dbg", "image": "busybox:1.37", "targetContainerName": "app",
           "env": [{"name": env.partition("=")[0], "value": env.partition("=")[2]}]}
    return Case(f"test_kubectl_debug_with_gpu_env_is_denied[{param}]",
                _merge_patch("alice", {"spec": {"ephemeralContainers": [dbg]}}, "ephemeralcontainers", "strategic"),
                (fragment,), setup="portion")


def _raw_ephemeral(param: str, spec: dict[str, Any], fragment: str) -> Case:
    dbg = {"name": "dbg", "image": "busybox:1.37", "targetContainerName": "app", **spec}
    return Case(f"test_raw_ephemeralcontainers_patch_is_denied[{param}]",
                _merge_patch("alice", {"spec": {"ephemeralContainers": [dbg]}}, "ephemeralcontainers", "strategic"),
                (fragment,), setup="bound")


_FIELDREF = {"fieldRef": {"fieldPath": f"metadata.annotations['{DEVICES}']"}}

ESCAPES: list[Case] = [
    *(Case(f"test_user_edits_a_fraction_annotation_of_a_bound_pod[{i}]", _bound_edit(verb, key, value), (key,),
           setup="bound") for verb, key, value, i in _BOUND_EDITS),
    Case("test_user_removes_or_changes_the_fractional_label[remove]", _kubectl("alice", "label", f"{LABEL}-"),
         (f"label {LABEL}",), setup="bound"),
    Case("test_user_removes_or_changes_the_fractional_label[set-false]",
         _kubectl("alice", "label", "--overwrite", f"{LABEL}=false"), (f"label {LABEL}",), setup="bound"),
    Case("test_one_json_patch_removing_every_fraction_key_and_the_label_is_still_reviewed", _remove_everything,
         (DEVICES, "gpu-fraction"), setup="bound"),
    Case("test_the_scheduler_cannot_change_or_remove_devices_after_bind[change]",
         _kubectl("binder", "annotate", "--overwrite", f"{DEVICES}=GPU-c,GPU-d"), (DEVICES, "was changed"),
         setup="bound"),
    Case("test_the_scheduler_cannot_change_or_remove_devices_after_bind[remove]",
         _kubectl("binder", "annotate", f"{DEVICES}-"), (DEVICES, "was removed"), setup="bound"),
    Case("test_admin_is_no_exception", _kubectl("admin", "annotate", "--overwrite", f"{DEVICES}=GPU-z"), (DEVICES,),
         setup="bound"),
    Case("test_fraction_annotations_cannot_change_through_pods_status",
         _merge_patch("admin", {"metadata": {"annotations": {DEVICES: "GPU-a,GPU-b,GPU-c,GPU-d",
                                                             C + "gpu-memory.limit-mib": "143770"},
                                             "labels": {LABEL: None}}}, "status"), (DEVICES,), setup="bound"),
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
                   {}, {LABEL: "true"}, f"label {LABEL}"),
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
    *(_mount_case(i, path, fragment) for i, path, fragment in [
        ("sidecar-mounts-injected-volume", None, "mounts the time-slicing MPS directory"),
        ("own-volume-same-dir", TS_DIR, "volume mine"),
        ("gpufrac-root", "/run/gpufrac", "volume mine"),
        ("mps-root", "/run/gpufrac/mps", "volume mine"),
        ("other-mode-dir", "/run/gpufrac/mps/sm-sharing", "volume mine"),
        ("unnormalized-path", "/run//gpufrac/mps/./time-slicing/", "volume mine"),
        ("parent-run", "/run", "volume mine"),
        ("host-root", "/", "volume mine"),
        ("var-run-alias", "/var/run/gpufrac/mps/time-slicing", "volume mine"),
        ("var-run-parent", "/var/run", "volume mine"),
    ]),
    Case("test_sidecar_with_its_own_volume_of_gpufracs_csi_driver_is_denied",
         _create(_with({"gpu-fraction": "0.5"},
                       [dict(_CUDA), {"name": "side", "image": "busybox:1.37",
                                      "volumeMounts": [{"name": "mine", "mountPath": "/mps"}]}],
                       volumes=[{"name": "mine", "csi": {"driver": "mps.gpufrac.io",
                                                         "volumeAttributes": {"mode": "sm-sharing"}}}])),
         ("volume mine",), unmutated=True),
    Case("test_fractional_container_mounts_the_other_modes_directory",
         _create(_with({"gpu-fraction": "0.5"},
                       [{"name": "app", "image": IMAGE, "volumeMounts": [{"name": "sm", "mountPath": "/sm"}]}],
                       volumes=[{"name": "sm", "hostPath": {"path": "/run/gpufrac/mps/sm-sharing"}}])),
         ("volume sm",), unmutated=True),
    *(_debug(i, env, fragment) for i, env, fragment in [
        ("visible-all", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES"),
        ("visible-uuid", "NVIDIA_VISIBLE_DEVICES=GPU-a", "NVIDIA_VISIBLE_DEVICES"),
        ("mps-pipe", f"CUDA_MPS_PIPE_DIRECTORY={TS_DIR}", "CUDA_MPS_PIPE_DIRECTORY"),
        ("memory-limit", "NVIDIA_GPU_MEMORY_LIMIT=143770", "NVIDIA_GPU_MEMORY_LIMIT"),
    ]),
    Case("test_kubectl_debug_custom_mount_of_the_mps_volume_is_denied",
         _merge_patch("alice", {"spec": {"ephemeralContainers": [
             {"name": "dbg", "image": "busybox:1.37", "targetContainerName": "app",
              "volumeMounts": [{"name": TS_VOLUME, "mountPath": "/mps"}]}]}}, "ephemeralcontainers", "strategic"),
         ("mounts the time-slicing MPS directory",), setup="portion"),
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
    *(Case(f"test_fractional_container_with_privileges[{i}]",
           _create(_with({"gpu-fraction": "0.5"}, [{"name": "app", "image": IMAGE, "securityContext": sc}])),
           (fragment,), unmutated=True) for sc, fragment, i in [
        ({"capabilities": {"add": ["SYS_ADMIN"]}}, "SYS_ADMIN", "sys-admin"),
        ({"capabilities": {"add": ["NET_ADMIN", "CAP_SYS_ADMIN"]}}, "SYS_ADMIN", "cap-sys-admin"),
        ({"capabilities": {"add": ["ALL"]}}, "SYS_ADMIN", "all-capabilities"),
        ({"capabilities": {"add": ["sys_admin"]}}, "SYS_ADMIN", "lowercase-sys-admin"),
        ({"privileged": True}, "privileged", "privileged"),
    ]),
    Case("test_fractional_init_container_privileged",
         _create(_with({"gpu-fraction": "0.5", "gpu-fraction-container-name": "setup"},
                       [{"name": "main", "image": "busybox:1.37"}],
                       initContainers=[{"name": "setup", "image": IMAGE, "securityContext": {"privileged": True}}])),
         ("privileged",), unmutated=True),
    *(Case(f"test_fractional_pod_shares_host_namespaces[{f}]",
           _create(_with({NV + "gpu-memory.request": "8Gi"}, [dict(_CUDA)], **{f: True})), (f,),
           unmutated=True) for f in ["hostPID", "hostIPC"]),
    *(Case(f"test_whole_gpus_beside_a_fraction[{where}]",
           _create(_with({"gpu-fraction": "0.5"}, [dict(_CUDA), {"name": "side", "image": IMAGE, **whole}])
                   if where == "sidecar" else
                   _with({"gpu-fraction": "0.5"}, [dict(_CUDA)], initContainers=[{"name": "setup", "image": IMAGE,
                                                                                   **whole}])),
           ("nvidia.com/gpu",), unmutated=True)
      for where, whole in [("sidecar", {"resources": {"limits": {"nvidia.com/gpu": "1"}}}),
                           ("init", {"resources": {"limits": {"nvidia.com/gpu": "1"}}})]),
]

CORPUS: list[Case] = DENIALS + ESCAPES

# Tests of the two files that are not a denial (what must still work), so not in the corpus.
NOT_DENIALS = {
    "test_wrong_examples_are_denied",  # examples/wrong-*.yaml: the same rules, as files (make demo)
    "test_users_canonical_values_on_create_are_replaced_not_kept",
    "test_a_plain_binding_by_the_scheduler_still_binds",
    "test_debug_container_without_env_gets_no_gpu",
}
