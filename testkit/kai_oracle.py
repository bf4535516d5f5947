"""KAI's admission translation of the pod-level shorthands, modeled from its source as a test oracle.

Independent of gpufrac's code (its own canonical form for `<N>Mi`, its own container resolution), written from:
- kai-scheduler/KAI-Scheduler pkg/admission/webhook/v1alpha2/nvfractions/mutation.go: Mutate,
  translateLegacyMemory, translateLegacyMemoryLimit, translateLegacyGpuFractionLimit (write a target only where it
  is absent; a different value already there is an error, so the pod is denied);
- pkg/common/resources/gpu_sharing_container_ref.go: GetFractionContainerRef, GetNvFractionsContainerName (the
  container the `nvidia.com/container.` keys name wins, then gpu-fraction-container-name, then containers[0]);
- pkg/common/resources/gpu_sharing.go: RequestsGPUFraction, GpuMemoryAnnotationToNvFractionsMemoryRequest
  (resource.MustParse("<N>Mi").String(): Kubernetes writes the largest binary suffix that divides the amount).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

NVIDIA = "nvidia.com/container."
SUFFIXES = (".gpu-memory.request", ".gpu-memory.limit", ".gpus.devices", ".gpu-compute.mode",
            ".gpu-compute.portion", ".gpu-compute.request")


class KaiDeniedError(Exception):
    """KAI's mutating webhook returns an error: the pod is denied."""


def requests_gpu_fraction(annotations: dict[str, str]) -> bool:
    if "gpu-fraction" in annotations or "gpu-memory" in annotations:
        return True
    return any(k.startswith(NVIDIA) and k.endswith((".gpu-memory.request", ".gpu-memory.limit")) for k in annotations)


def _nv_fractions_container(annotations: dict[str, str]) -> str | None:
    names = set()
    for key in annotations:
        if not key.startswith(NVIDIA):
            continue
        suffix = next((s for s in SUFFIXES if key.endswith(s)), None)
        name = key[len(NVIDIA):-len(suffix)] if suffix else ""
        if not name:
            raise KaiDeniedError(f"invalid NvFractions annotation key: {key}")
        names.add(name)
    if len(names) > 1:
        raise KaiDeniedError("currently, kai doesn't support multiple containers with fractional GPU requests")
    return names.pop() if names else None


def fraction_container(annotations: dict[str, str], containers: list[str], init: list[str]) -> str:
    named = annotations.get("gpu-fraction-container-name")
    nv = _nv_fractions_container(annotations)
    if named is not None and nv is not None and named != nv:
        raise KaiDeniedError(f"gpu-fraction-container-name annotation value {named} does not match container name {nv}")
    name = nv if nv is not None else named
    if name is None:
        return containers[0]
    if name not in init and name not in containers:
        raise KaiDeniedError(f"container with name {name} not found for fraction request")
    return name


def mebibytes_string(mib: int) -> str:
    amount, power = mib * 1024 * 1024, 0
    while amount % 1024 == 0 and power < 6:
        amount //= 1024
        power += 1
    return f"{amount}{['', 'Ki', 'Mi', 'Gi', 'Ti', 'Pi', 'Ei'][power]}"


def _write(annotations: dict[str, str], source: str, target: str, value: str) -> None:
    if target not in annotations:
        annotations[target] = value
    elif annotations[target] != value:
        raise KaiDeniedError(f"{source} annotation conflicts with {target} annotation")


def kai_mutate(annotations: dict[str, str], containers: list[str], init: Sequence[str] = ()) -> dict[str, str]:
    """The annotations after KAI's nvfractions Mutate; raises KaiDeniedError where KAI denies the pod."""
    result = dict(annotations)
    if not containers or not requests_gpu_fraction(result):
        return result
    name = fraction_container(result, list(containers), list(init))
    if "gpu-memory" in result:
        if not re.fullmatch(r"[0-9]+", result["gpu-memory"]):
            raise KaiDeniedError("failed to parse gpu memory annotation value")
        _write(result, "gpu-memory", f"{NVIDIA}{name}.gpu-memory.request", mebibytes_string(int(result["gpu-memory"])))
    if "gpu-memory.limit" in result:
        _write(result, "gpu-memory.limit", f"{NVIDIA}{name}.gpu-memory.limit", result["gpu-memory.limit"])
    if "gpu-fraction.limit" in result:
        _write(result, "gpu-fraction.limit", f"kai.scheduler/container.{name}.gpu-memory.portion.limit",
               result["gpu-fraction.limit"])
    return result


# --- KAI's older GPU-sharing admission (the `gpusharing` plugin: v0.17, the last release before NvFractions) -------
# Modeled from NVIDIA/KAI-Scheduler pkg/admission/webhook/v1alpha2/gpusharing/gpu_sharing.go (Mutate),
# pkg/binder/common/gpu_access.go (GetFractionContainerRef, AddGPUSharingEnvVars), env_vars.go
# (AddEnvVarToContainer, AddDirectEnvVarsConfigMapSource), gpusharingconfigmap/config_map.go
# (SetGpuCapabilitiesConfigMapName, generateConfigMapNamePrefix) and the volume name of
# kai-scheduler/KAI-Scheduler pkg/admission/webhook/v1alpha2/gpusharing/pod_mutation.go (getConfigVolumeName).

SHARED_GPU_CONFIGMAP = "runai/shared-gpu-configmap"


def _configmap_env(name: str, configmap: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"configMapKeyRef": {"key": name, "name": configmap}}}


def kai_v017_mutate(obj: dict[str, Any], random: str = "x7k2q9m") -> dict[str, Any]:
    """The pod after KAI v0.17's admission in its GPU-sharing mode; `random` stands for its 7 random characters."""
    import copy

    result = copy.deepcopy(obj)
    annotations = result["metadata"].setdefault("annotations", {})
    spec = result["spec"]
    if not spec.get("containers") or not ("gpu-fraction" in annotations or "gpu-memory" in annotations):
        return result
    name = annotations.get("gpu-fraction-container-name")
    kind, index = "containers", 0
    if name is not None:
        found = [(k, i) for k in ("initContainers", "containers") for i, c in enumerate(spec.get(k) or [])
                 if c["name"] == name]
        if not found:
            raise KaiDeniedError(f"failed to get fraction container ref: container with name {name} not found for "
                                 "fraction request")
        kind, index = found[0]
    container = spec[kind][index]
    if SHARED_GPU_CONFIGMAP not in annotations:
        base = (result["metadata"].get("ownerReferences") or [{}])[0].get("name") or result["metadata"]["name"]
        annotations[SHARED_GPU_CONFIGMAP] = f"{base[:63 - 13 - 10 - len(str(index)) - 1 - 5]}-{random}-shared-gpu"
    configmap = f"{annotations[SHARED_GPU_CONFIGMAP]}-{'i' if kind == 'initContainers' else ''}{index}"
    for env_name in ("NVIDIA_VISIBLE_DEVICES", "RUNAI_NUM_OF_GPUS", "GPU_PORTION"):
        container["env"] = [e for e in container.get("env") or [] if e["name"] != env_name]
        container["env"].append(_configmap_env(env_name, configmap))
    volume = re.sub(r"[^a-z0-9-]+", "-", f"{configmap}-vol".lower()).strip("-")
    spec["volumes"] = [v for v in spec.get("volumes") or [] if v["name"] != volume]
    spec["volumes"].append({"name": volume, "configMap": {"name": configmap}})
    evar = f"{configmap}-evar"
    if not any((e.get("configMapRef") or {}).get("name") == evar for e in container.get("envFrom") or []):
        container.setdefault("envFrom", []).append({"configMapRef": {"name": evar, "optional": False}})
    return result
