"""Hypothesis strategies for hostile AdmissionReviews, shared by the property tests, `make fuzz` and `make soak`.

Reviews are built in layers: a pod (mostly schema-valid, sometimes with thousands of containers), fraction
annotations under every prefix the webhook reads (valid scenarios, near-valid values, junk, control characters,
huge values), an envelope with every operation and subresource, then optional corruption that swaps a random
field anywhere in the body for a wrong type or deletes it.

`GPUFRAC_FUZZ_EXAMPLES` scales every property test: unset, the suite stays fast for `make test`; `make fuzz`
sets it to 10000.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import CanonicalField, Field
from gpufrac.core.contract import FRACTIONAL_LABEL
from testkit.reviews import review_body

BINDER = "system:serviceaccount:kai-scheduler:binder"
FUZZ_EXAMPLES = int(os.environ.get("GPUFRAC_FUZZ_EXAMPLES") or 0)


def examples(default: int, fuzz_share: float = 1.0) -> settings:
    """Settings for a property: `default` examples in `make test`, FUZZ_EXAMPLES * fuzz_share under `make fuzz`."""
    count = max(default, int(FUZZ_EXAMPLES * fuzz_share)) if FUZZ_EXAMPLES else default
    return settings(max_examples=count, deadline=None, database=None, print_blob=True,
                    suppress_health_check=list(HealthCheck))


# --- names -----------------------------------------------------------------------------------------------------

MAX_NAME = ann.max_container_name_length()
VALID_NAMES = ("app", "sidecar", "worker", "init-a", "c1", "a" * MAX_NAME, "b" * (MAX_NAME + 1), "x" * 63)
BAD_NAMES = ("App", "a.b", "", "ä", "app\n", "-app", "a_b", "app ", "\x00", "a" * 64, "日本")
FOREIGN_NAMES = ("ghost", "app2", "APP")


def container_name(pool: list[str]) -> st.SearchStrategy[str]:
    options: list[st.SearchStrategy[str]] = [st.sampled_from(FOREIGN_NAMES), st.sampled_from(BAD_NAMES)]
    if pool:
        options.insert(0, st.sampled_from(pool))
    return st.one_of(*options)


# --- values ------------------------------------------------------------------------------------------------------

NEAR_QUANTITIES = (
    "40Gi", "1Gi", "1Mi", "1000M", "1.5Mi", "0.5Gi", "1e9", "1E9", "1e400", "1e999999", "1e1000000", "1e-999999999",
    "1e-1000000", "0x10", "-1", "-1Gi", "+40Gi", "0", "0Gi", "1", "1023Ki", "1025Ki", "NaN", "nan", "inf", "Infinity",
    "-inf", "40 Gi", " 40Gi", "40Gi ", "40Gi\n", "40gi", "40GB", "40G", "40Ei", "1Pi", "1048576Ti", "1048577Ti",
    "9" * 64, "9" * 65, "1" + "0" * 63, "Gi", ".", ".5Gi", "5.Gi", "1e", "1e+", "1_000", "１Gi", "40Gi\x00", "",
)
NEAR_DECIMALS = (
    "0.5", ".5", "5.", "0.25", "2.5e-1", "0.99999", "0.999999", "0.00001", "1e-5", "1", "0", "1.0", "0.0", "-0.5",
    "+0.5", "NaN", "nan", "inf", "0x1p-1", "0.5\n", " 0.5", "0,5", "½", "0.5.5", "5e-1", "5E-1", "1e-999", "1e-1000",
    "0." + "0" * 62 + "1", "0.50000", "0.500001", "0.3", "0.30000", "0.7", "0.8", "0.9", "0.6",
)
NEAR_INTEGERS = ("1", "2", "4", "8", "64", "65", "0", "-1", "01", "1.0", "1e1", "2\n", "999999999999999",
                 "9999999999999999", "0x2", "２", "20480", "1024", "4096", "1")
MODES = ("time-slicing", "sm-sharing", "TIME-SLICING", "mps", "", "time-slicing ", "sm_sharing")
DEVICE_IDS = ("GPU-0d7f2a6c-1b8e-4f3d-9c2a-5e6f7a8b9c0d", "GPU-11111111-2222-3333-4444-555555555555",
              "MIG-GPU-0d7f2a6c/1/0", "0", "1", "k8s.device-plugin.nvidia.com/gpu=GPU-abc", "gpu0", "", " ", "GPU-",
              "GPU-zz", "../../etc", "nvidia.com/gpu=all", "nvidia.com/gpu=0:1")

CONTROL = st.characters(min_codepoint=0, max_codepoint=0x1F)
WEIRD_TEXT = st.text(alphabet=st.one_of(CONTROL, st.characters(codec="utf-8"), st.sampled_from("0123456789.eEGiM-+")),
                     max_size=80)


def huge_value() -> st.SearchStrategy[str]:
    return st.sampled_from(("9" * 5000, "0." + "5" * 5000, "x" * 70000, "Gi" * 3000, "1e" + "9" * 500))


def junk_value() -> st.SearchStrategy[str]:
    return st.one_of(WEIRD_TEXT, huge_value(), st.just(""))


def quantity_value() -> st.SearchStrategy[str]:
    generated = st.builds(lambda n, s: f"{n}{s}", st.integers(-5, 2**50),
                          st.sampled_from(["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "m", "e3",
                                           "e-3", "E12"]))
    return st.one_of(st.sampled_from(NEAR_QUANTITIES), generated, junk_value())


def decimal_value() -> st.SearchStrategy[str]:
    generated = st.decimals(min_value=0, max_value=2, places=6, allow_nan=False).map(str)
    return st.one_of(st.sampled_from(NEAR_DECIMALS), generated, junk_value())


def integer_value() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(NEAR_INTEGERS), st.integers(-3, 200).map(str), junk_value())


def devices_value() -> st.SearchStrategy[str]:
    return st.one_of(st.lists(st.sampled_from(DEVICE_IDS), min_size=1, max_size=5).map(",".join),
                     st.lists(st.sampled_from(DEVICE_IDS[:2]), min_size=1, max_size=80).map(",".join), junk_value())


# --- annotations -------------------------------------------------------------------------------------------------

SHORTHAND_VALUES = {
    ann.FRACTION: decimal_value, ann.FRACTION_LIMIT: decimal_value, ann.MEMORY: integer_value,
    ann.MEMORY_LIMIT: quantity_value, ann.NUM_DEVICES: integer_value,
}
FIELD_VALUES: dict[Field, Callable[[], st.SearchStrategy[str]]] = {
    Field.MEMORY_REQUEST: quantity_value, Field.MEMORY_LIMIT: quantity_value,
    Field.COMPUTE_MODE: lambda: st.one_of(st.sampled_from(MODES), junk_value()),
    Field.DEVICES: devices_value,
    Field.COMPUTE_PORTION: lambda: st.one_of(decimal_value(), st.sampled_from(["1", "0.5", "5e-1"]))}
BAD_SUFFIXES = ("gpu-memory", "gpus.device", "", "gpu-memory.request.extra", "GPU-MEMORY.REQUEST")


@st.composite
def annotation_entry(draw: st.DrawFn, names: list[str]) -> tuple[str, str]:
    kind = draw(st.sampled_from(["shorthand", "name", "nvidia", "nvidia", "nvidia", "kai", "gpufrac", "other",
                                 "bad-suffix"]))
    if kind == "shorthand":
        key = draw(st.sampled_from(sorted(SHORTHAND_VALUES)))
        return key, draw(st.one_of(SHORTHAND_VALUES[key](), junk_value()))
    if kind == "name":
        return ann.CONTAINER_NAME, draw(container_name(names))
    name = draw(container_name(names))
    if kind == "nvidia":
        suffix = draw(st.sampled_from(list(Field)))
        return ann.nvidia_key(name, suffix), draw(FIELD_VALUES[suffix]())
    if kind == "kai":
        return ann.portion_limit_key(name), draw(decimal_value())
    if kind == "gpufrac":
        key = draw(st.sampled_from([ann.canonical_key(name, f) for f in CanonicalField] +
                                   ["gpufrac.io/fractional", "gpufrac.io/other", "gpufrac.io/container."]))
        return key, draw(st.one_of(st.sampled_from(["1024", "time-slicing", "0=1024M", "true"]), junk_value()))
    if kind == "bad-suffix":
        prefix = draw(st.sampled_from([ann.NVIDIA_PREFIX, ann.KAI_PREFIX, ann.CANONICAL_PREFIX]))
        return f"{prefix}{name}.{draw(st.sampled_from(BAD_SUFFIXES))}", draw(junk_value())
    key = draw(st.one_of(st.sampled_from(["example.com/x", "nvidia.com/gpu", "kai.scheduler/queue", "gpu-fractionx",
                                          "nvidia.com/container", "gpu-fraction.limit ", "nvidia.com/container."]),
                         st.text(max_size=40)))
    return key, draw(junk_value())


@st.composite
def scenario(draw: st.DrawFn, names: list[str]) -> dict[str, str]:
    """A coherent request, mostly valid, so that many examples get as far as mutation and validation."""
    regular = names[:1] or ["app"]
    kind = draw(st.sampled_from(["portion", "memory", "per-container", "none"]))
    out: dict[str, str] = {}
    if kind == "portion":
        fraction = draw(st.sampled_from(["0.5", "0.25", ".3", "0.1", "0.9"]))
        out[ann.FRACTION] = fraction
        if draw(st.booleans()):
            out[ann.FRACTION_LIMIT] = draw(st.sampled_from(["0.95", "0.99", "0.8"]))
    elif kind == "memory":
        out[ann.MEMORY] = draw(st.sampled_from(["1024", "20480", "1"]))
        if draw(st.booleans()):
            out[ann.MEMORY_LIMIT] = draw(st.sampled_from(["40Gi", "60Gi", "1Ti"]))
    elif kind == "per-container":
        for name in draw(st.lists(st.sampled_from(names or regular), min_size=1, max_size=3, unique=True)):
            out[ann.nvidia_key(name, Field.MEMORY_REQUEST)] = draw(st.sampled_from(["1Gi", "40Gi", "1000M"]))
            if draw(st.booleans()):
                out[ann.nvidia_key(name, Field.MEMORY_LIMIT)] = draw(st.sampled_from(["40Gi", "60Gi"]))
    if kind != "none" and draw(st.booleans()):
        mode = draw(st.sampled_from(["time-slicing", "sm-sharing"]))
        for name in (names if kind == "per-container" else regular):
            out[ann.nvidia_key(name, Field.COMPUTE_MODE)] = mode
    if kind != "none" and draw(st.booleans()):
        out[ann.NUM_DEVICES] = draw(st.sampled_from(["1", "2", "8"]))
    return out


@st.composite
def pod_annotations(draw: st.DrawFn, names: list[str]) -> dict[str, str]:
    result = draw(scenario(names))
    for key, value in draw(st.lists(annotation_entry(names), max_size=6)):
        result[key] = value
    if draw(st.integers(0, 60)) == 0:  # thousands of keys, now and then
        for i in range(draw(st.sampled_from([500, 3000]))):
            result[f"example.com/k{i}"] = "v" * (i % 50)
    return result


# --- pods --------------------------------------------------------------------------------------------------------

ENV_NAMES = ("NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "NVIDIA_GPU_MEMORY_LIMIT", "HOME", "PATH",
             "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")


@st.composite
def container(draw: st.DrawFn, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, "image": "nvcr.io/nvidia/cuda:13.0.2-base-ubuntu24.04"}
    if draw(st.integers(0, 3)) == 0:
        spec["env"] = [{"name": n, "value": draw(st.sampled_from(["all", "void", "none", "0", "/tmp", ""]))}
                       for n in draw(st.lists(st.sampled_from(ENV_NAMES), max_size=3))]  # names may repeat
    if draw(st.integers(0, 5)) == 0:
        spec["volumeMounts"] = [{"name": draw(st.sampled_from(["data", "gpufrac-mps-time-slicing",
                                                               "gpufrac-mps-sm-sharing"])), "mountPath": "/data"}]
    if draw(st.integers(0, 6)) == 0:
        spec["resources"] = {"limits": {draw(st.sampled_from(["nvidia.com/gpu", "cpu"])): "1"}}
    if draw(st.integers(0, 8)) == 0:
        spec["securityContext"] = {"privileged": draw(st.booleans())}
    return spec


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    """A Pod; with no corruption applied it passes kubernetes_validate (names are DNS labels or deliberately not)."""
    big = draw(st.integers(0, 40)) == 0
    if big:
        count = draw(st.sampled_from([300, 2000]))
        names = [f"c{i}" for i in range(count)]
        containers = [{"name": n, "image": "busybox"} for n in names]
    else:
        names = draw(st.lists(st.one_of(st.sampled_from(VALID_NAMES), st.sampled_from(BAD_NAMES[:3])),
                              min_size=0, max_size=4, unique=True))
        containers = [draw(container(n)) for n in names]
    init_names = draw(st.lists(st.sampled_from(["init-a", "init-b", "app"]), max_size=2, unique=True))
    pod_spec: dict[str, Any] = {"containers": containers}
    if init_names:
        pod_spec["initContainers"] = [draw(container(n)) for n in init_names]
    if draw(st.integers(0, 5)) == 0:
        pod_spec["ephemeralContainers"] = [{"name": "debugger", "image": "busybox"}]
    if draw(st.integers(0, 5)) == 0:
        pod_spec["volumes"] = [draw(st.sampled_from([
            {"name": "data", "emptyDir": {}},
            {"name": "mps", "hostPath": {"path": "/run/gpufrac/mps"}},
            {"name": "gpufrac-mps-time-slicing", "hostPath": {"path": "/tmp"}},
        ]))]
    if draw(st.integers(0, 8)) == 0:
        pod_spec[draw(st.sampled_from(["hostPID", "hostIPC"]))] = True
    metadata: dict[str, Any] = {"name": "p", "namespace": "team-a",
                                "annotations": draw(pod_annotations(names + init_names))}
    if draw(st.integers(0, 4)) == 0:
        metadata["labels"] = {FRACTIONAL_LABEL: draw(st.sampled_from(["true", "false", ""]))}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


# --- corruption --------------------------------------------------------------------------------------------------

WRONG_TYPES: tuple[Any, ...] = (None, [], {}, "", 0, -1, 1.5, True, "x", [1], ["a"], {"a": 1}, {"name": 1},
                                [{"x": None}], 1e308)


def _paths(value: Any, path: tuple[Any, ...] = (), depth: int = 0,
           out: list[tuple[Any, ...]] | None = None) -> list[tuple[Any, ...]]:
    out = [] if out is None else out
    if depth > 7 or len(out) > 400:
        return out
    if isinstance(value, dict):
        for key, child in value.items():
            out.append((*path, key))
            _paths(child, (*path, key), depth + 1, out)
    elif isinstance(value, list):
        for index, child in enumerate(value[:5]):
            out.append((*path, index))
            _paths(child, (*path, index), depth + 1, out)
    return out


@st.composite
def corrupted(draw: st.DrawFn, body: dict[str, Any]) -> dict[str, Any]:
    """The body with up to three fields anywhere swapped for a wrong type, deleted, or their parent emptied."""
    body = copy.deepcopy(body)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(body)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = body
        for step in path[:-1]:
            parent = parent[step]
        if draw(st.integers(0, 4)) == 0 and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = copy.deepcopy(draw(st.sampled_from(WRONG_TYPES)))
    return body


# --- reviews -----------------------------------------------------------------------------------------------------

OPERATIONS = ("CREATE", "CREATE", "UPDATE", "DELETE", "CONNECT")
SUB_RESOURCES = ("", "", "", "binding", "ephemeralcontainers", "status", "exec")


def envelope(obj: Any, *, operation: str = "CREATE", old: Any = None, user: str = "alice", sub_resource: str = "",
             uid: str = "fuzz-uid", resource: str = "pods") -> dict[str, Any]:
    """The kit's review of `obj` as a user of the system:authenticated group sends it (a Binding's kind for the
    binding subresource)."""
    return review_body(obj, operation=operation, old=old, user=user, groups=("system:authenticated",),
                       sub_resource=sub_resource, uid=uid, resource=resource,
                       kind="Binding" if sub_resource == "binding" else "Pod")


@st.composite
def reviews(draw: st.DrawFn, corrupt: bool = True) -> dict[str, Any]:
    obj = draw(pods())
    operation = draw(st.sampled_from(OPERATIONS))
    old = None
    if operation == "UPDATE" or draw(st.integers(0, 5)) == 0:
        old = draw(st.one_of(st.just(copy.deepcopy(obj)), pods(), st.none()))
        if old is not None and draw(st.booleans()):  # the scheduler's bind: add values to what was there
            obj = copy.deepcopy(old)
            obj["metadata"]["annotations"].update(draw(st.dictionaries(
                st.sampled_from([ann.nvidia_key(n, f) for n in ("app", "sidecar", "c1", "Bad", "ghost")
                                 for f in (Field.MEMORY_REQUEST, Field.MEMORY_LIMIT, Field.DEVICES,
                                           Field.COMPUTE_PORTION)]),
                st.one_of(st.sampled_from(["40Gi", "20Gi", DEVICE_IDS[0], f"{DEVICE_IDS[0]},{DEVICE_IDS[1]}", "0.5"]),
                          quantity_value()), max_size=3)))
    body = envelope(obj, operation=operation, old=old, sub_resource=draw(st.sampled_from(SUB_RESOURCES)),
                    user=draw(st.sampled_from(["alice", BINDER, "", "system:admin"])),
                    uid=draw(st.one_of(st.just("8f7c2a10-0000-4000-8000-000000000001"), st.text(min_size=1,
                                                                                                max_size=40))),
                    resource=draw(st.sampled_from(["pods", "pods", "pods", "deployments", ""])))
    if corrupt and draw(st.integers(0, 2)) == 0:
        body = draw(corrupted(body))
    return body


def _nest(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)


def raw_bodies() -> st.SearchStrategy[bytes]:
    """What reaches the HTTP layer: reviews as JSON, truncated or spliced JSON, and bytes that are not JSON at all."""
    as_json = reviews().map(lambda b: json.dumps(b).encode())
    return st.one_of(
        as_json, as_json, as_json,
        st.tuples(as_json, st.integers(0, 2000)).map(lambda t: t[0][: t[1]]),
        st.binary(max_size=300),
        st.sampled_from([b"", b"null", b"[]", b"{}", b"1e999", b'"x"', b"[" * 50000, b'{"a":' * 20000,
                         b"\xff\xfe\x00", b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":'
                         b'{"uid":"\\ud800","operation":"CREATE","resource":{"resource":"pods"},"object":{}}}']),
        st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=10), _nest,
                     max_leaves=20).map(lambda v: json.dumps(v).encode()),
    )
