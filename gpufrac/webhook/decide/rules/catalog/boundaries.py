"""The rule `boundaries`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import (
    LIMIT_ENV_PREFIXES,
    MODE_ATTRIBUTE,
    NO_GPU_VALUES,
    SHM_SUBDIR,
    Delivery,
    LimitEnv,
)
from gpufrac.webhook.decide import pod as podview
from gpufrac.webhook.decide.cel import lit, one, regex, str_list, when
from gpufrac.webhook.decide.errors import Violation
from gpufrac.webhook.decide.fractions import ContainerFraction, PodFractions
from gpufrac.webhook.decide.mutation import SHM_VOLUME, injected_volumes, volume_name
from gpufrac.webhook.decide.policy import Policy
from gpufrac.webhook.decide.rules.context import PodReview
from gpufrac.webhook.decide.rules.parts import (
    CSI_USED,
    CSI_WRITES,
    GRANTS_SYS_ADMIN,
    MPS_REACHED,
    is_fraction,
    mode_dir,
    per_container,
)
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope

# Capabilities that let a container reach devices or namespaces beyond its own (ALL includes SYS_ADMIN).
ESCALATING_CAPABILITIES = frozenset({"SYS_ADMIN", "ALL"})
_NODE = "needs the node's facts (the MPS directories as the node resolves host paths)"


def cel() -> str:
    """`boundaries`, but a hostPath into the MPS directories written other than plainly (`..`, `//`,
    `/./`), which needs the node's path normalization, and messages grouped by check rather than by container."""
    host = [when(f"object.spec.?{f}.orValue(false)",
                 one(lit(f"pod: sets {f}: true; a pod with GPU fractions cannot share the host's process or IPC "
                         "namespace, which would reach other pods' GPU work")))
            for f in ("hostPID", "hostIPC")]
    injected = " || ".join(
        f"(v.name == {lit(volume_name(m))} && v.csi.?volumeAttributes.orValue({{}}) == "
        f"{{{lit(MODE_ATTRIBUTE)}: {lit(str(m))}}} && !has(v.csi.readOnly) && !has(v.csi.fsType) && "
        f"!has(v.csi.nodePublishSecretRef))" for m in ComputeMode)
    foreign_csi = (f"object.spec.?volumes.orValue([]).filter(v, has(v.csi) && v.csi.driver == variables.csiDriver && "
                   f"!(variables.csiDelivery && ({injected})))"
                   f".map(v, 'volume ' + v.name + {lit(CSI_USED)} + variables.csiDriver + {lit(CSI_WRITES)})")
    plain = r"^(/[^/.][^/]*)*/?$"
    path = "v.hostPath.path"
    trimmed = f"({path} != '/' && {path}.endsWith('/') ? {path}.substring(0, size({path}) - 1) : {path})"
    resolved = (f"({trimmed} == '/var/run' ? '/run' : {trimmed}.startsWith('/var/run/') ? "
                f"'/run' + {trimmed}.substring(8) : {trimmed})")
    dirs = f"[{', '.join(mode_dir(str(m)) for m in ComputeMode)}, {mode_dir(SHM_SUBDIR)}]"
    reach = (f"{dirs}.exists(d, {resolved} == d || {resolved}.startsWith(d + '/') || "
             f"d.startsWith(({resolved} == '/' ? '' : {resolved}) + '/'))")
    foreign_host = (f"object.spec.?volumes.orValue([]).filter(v, has(v.hostPath) && variables.csiDelivery && "
                    f"{path}.matches({regex(plain)}) && {reach})"
                    f".map(v, 'volume ' + v.name + ': mounts ' + {path} + {lit(MPS_REACHED)})")
    resources = "(c.?resources.?limits.orValue({}).exists(r, r == 'nvidia.com/gpu') || " \
                "c.?resources.?requests.orValue({}).exists(r, r == 'nvidia.com/gpu'))"

    def whole(c: str, ephemeral: str) -> tuple[str, str]:
        return resources, lit(f"asks for whole GPUs ({ann.WHOLE_GPU_RESOURCE}) in a pod with GPU fractions; put "
                              "whole-GPU and fractional work in separate pods")

    def mounts(c: str, ephemeral: str) -> tuple[str, str]:
        mode = f"variables.modeOf[variables.names.indexOf({c}.name)]"
        wrong = " || ".join(
            f"(m.name == {lit(volume_name(mode_))} && !({is_fraction(c, ephemeral)} && {mode} == {lit(str(mode_))}))"
            for mode_ in ComputeMode)
        selected = f"{c}.?volumeMounts.orValue([]).filter(m, variables.csiDelivery && ({wrong}))"
        message = (f"{selected}.map(m, 'mounts the ' + m.name.substring({len('gpufrac-mps-')}) + ' MPS directory but '"
                   f" + 'is not a ' + m.name.substring({len('gpufrac-mps-')}) + ' fraction').join('; ' + "
                   f"({ephemeral} ? 'ephemeral container ' : 'container ') + {c}.name + ': ')")
        return f"size({selected}) > 0", message

    def privileged(c: str, ephemeral: str) -> tuple[str, str]:
        return (f"{c}.?securityContext.?privileged.orValue(false)",
                lit("is privileged: a privileged container sees every GPU on the node, so it cannot be part of a pod "
                    "with GPU fractions; remove securityContext.privileged"))

    escalating = str_list(sorted({*ESCALATING_CAPABILITIES, *(f"CAP_{x}" for x in ESCALATING_CAPABILITIES)}))

    def capabilities(c: str, ephemeral: str) -> tuple[str, str]:
        added = f"{c}.?securityContext.?capabilities.?add.orValue([]).filter(x, x.upperAscii() in {escalating})"
        return (f"size({added}) > 0",
                f"'adds ' + {added}.join(', ') + {lit(GRANTS_SYS_ADMIN)}")

    visible, prefixes = lit(str(LimitEnv.VISIBLE_DEVICES)), [lit(p) for p in LIMIT_ENV_PREFIXES]
    no_gpu = str_list(NO_GPU_VALUES)
    bad_visible = f"(e.name == {visible} && !(e.?value.orValue('') in {no_gpu} && has(e.value)))"
    bad_prefix = " || ".join(f"e.name.startsWith({p})" for p in prefixes)

    def env(c: str, ephemeral: str) -> tuple[str, str]:
        selected = f"{c}.?env.orValue([]).filter(e, {bad_visible} || (e.name != {visible} && ({bad_prefix})))"
        names = "variables.fractional.join(', ')"
        only = lit(f"sets {LimitEnv.VISIBLE_DEVICES} in a pod with GPU fractions; only {' or '.join(NO_GPU_VALUES)} "
                   "is allowed outside the fractional containers (")
        message = (f"{selected}.map(e, e.name == {visible} ? {only} + {names} + ')' : "
                   f"'sets ' + e.name + ', which only the fractional containers carry, as gpufrac injects it')"
                   f".join('; ' + ({ephemeral} ? 'ephemeral container ' : 'container ') + {c}.name + ': ')")
        return f"!{is_fraction(c, ephemeral)} && size({selected}) > 0", message

    checks = [per_container(check) for check in (whole, mounts, privileged, capabilities, env)]
    return when("size(variables.fractional) > 0", " + ".join([*host, foreign_csi, foreign_host, *checks]))


def _host_path(path: str) -> str:
    """A hostPath as the node resolves it: normalized, with /var/run read as the /run it links to."""
    path = posixpath.normpath("/" + path.lstrip("/"))
    if path == "/var/run" or path.startswith("/var/run/"):
        path = "/run" + path[len("/var/run"):]
    return path


def _is_mps_path(path: str, policy: Policy) -> bool:
    path = _host_path(path)
    for directory in (*policy.mps_dirs.values(), policy.mps_shm_dir):
        directory = _host_path(directory)
        if path == directory or path.startswith(directory + "/") or directory.startswith(path.rstrip("/") + "/"):
            return True
    return False


def foreign_mps_volume(volume: dict[str, Any], policy: Policy) -> list[Violation]:
    """A volume gpufrac did not write that reaches the node's MPS directories: a hostPath into them, or a volume
    of gpufrac's CSI driver."""
    host_path = volume.get("hostPath")
    if isinstance(host_path, dict) and isinstance(host_path.get("path"), str) and \
            _is_mps_path(host_path["path"], policy):
        return [Violation(f"volume {volume['name']}", f"mounts {host_path['path']}, the node's MPS directories; "
                          "gpufrac mounts the right one into each fractional container")]
    csi = volume.get("csi")
    if isinstance(csi, dict) and csi.get("driver") == policy.csi_driver:
        return [Violation(f"volume {volume['name']}", f"uses gpufrac's CSI driver {policy.csi_driver}; gpufrac "
                          "writes the one volume each fractional container's mode needs (gpufrac-mps-<mode>)")]
    return []


@functools.lru_cache(maxsize=16)
def _our_volumes(policy: Policy) -> tuple[dict[str, ComputeMode | None], dict[str, dict[str, Any]]]:
    """The volume names gpufrac writes, each with the mode whose directories it holds (None: the shared memory
    of every mode), and the volumes it writes by name; to compare with, never written into a pod."""
    ours: dict[str, ComputeMode | None] = {volume_name(mode): mode for mode in policy.mps_dirs}
    if policy.delivery is Delivery.HOST_PATH:
        ours[SHM_VOLUME] = None
    written = {v["name"]: v for mode in policy.mps_dirs for v in injected_volumes(mode, policy)}
    return ours, written


def boundaries(obj: dict[str, Any], fractions: PodFractions, policy: Policy) -> list[Violation]:
    """What would let a fractional pod, or a container beside a fraction, reach past the fraction: each named rule
    below, the pod's first, then each container's, container by container."""
    out = [*boundary_host_namespaces(obj), *boundary_foreign_volumes(obj, policy)]
    for ref in podview.containers(obj):
        container = _PodContainer.of(ref, fractions, policy)
        for rule in _CONTAINER_BOUNDARIES:
            out += rule(container)
    return out


def boundary_host_namespaces(obj: dict[str, Any]) -> list[Violation]:
    pod_spec = podview.spec(obj)
    return [Violation("pod", f"sets {field}: true; a pod with GPU fractions cannot share the host's process or IPC "
                             "namespace, which would reach other pods' GPU work")
            for field in ("hostPID", "hostIPC") if pod_spec.get(field) is True]


def boundary_foreign_volumes(obj: dict[str, Any], policy: Policy) -> list[Violation]:
    _, written = _our_volumes(policy)
    return [violation for volume in podview.volumes(obj) if written.get(volume["name"]) != volume
            for violation in foreign_mps_volume(volume, policy)]


@dataclass(frozen=True)
class _PodContainer:
    """A container of a fractional pod, as the container rules of `boundaries` see it."""

    ref: podview.ContainerRef
    where: str  # how a denial names it
    fraction: ContainerFraction | None  # its own fraction (an ephemeral container never holds one)
    fractions: PodFractions
    our_volumes: dict[str, ComputeMode | None]  # gpufrac's volume names, each with the mode it holds

    @classmethod
    def of(cls, ref: podview.ContainerRef, fractions: PodFractions, policy: Policy) -> _PodContainer:
        ephemeral = ref.kind is podview.ContainerKind.EPHEMERAL
        return cls(ref, f"{'ephemeral ' if ephemeral else ''}container {ref.name}",
                   None if ephemeral else fractions.containers.get(ref.name), fractions, _our_volumes(policy)[0])


def boundary_whole_gpus(c: _PodContainer) -> list[Violation]:
    if ann.WHOLE_GPU_RESOURCE not in podview.resource_names(c.ref):
        return []
    return [Violation(c.where, f"asks for whole GPUs ({ann.WHOLE_GPU_RESOURCE}) in a pod with GPU fractions; put "
                               "whole-GPU and fractional work in separate pods")]


def boundary_mps_mounts(c: _PodContainer) -> list[Violation]:
    """Each MPS directory only into a fraction of its mode; the shared memory only into a fraction."""
    out: list[Violation] = []
    for mount in podview.volume_mounts(c.ref):
        if mount["name"] not in c.our_volumes:
            continue
        mode = c.our_volumes[mount["name"]]
        if mode is None and c.fraction is None:
            out.append(Violation(c.where, "mounts the MPS daemons' shared memory but is not a GPU fraction"))
        elif mode is not None and (c.fraction is None or c.fraction.mode != mode):
            out.append(Violation(c.where, f"mounts the {mode} MPS directory but is not a {mode} fraction"))
    return out


def boundary_privileged(c: _PodContainer) -> list[Violation]:
    """Any container of a fractional pod, not only the fractional one: a privileged sidecar would hand the pod every
    GPU of the node."""
    if podview.security_context(c.ref).get("privileged") is not True:
        return []
    return [Violation(c.where, "is privileged: a privileged container sees every GPU on the node, so it cannot be "
                               "part of a pod with GPU fractions; remove securityContext.privileged")]


def boundary_capabilities(c: _PodContainer) -> list[Violation]:
    escalating = sorted({cap for cap in podview.added_capabilities(c.ref)
                         if cap.upper().removeprefix("CAP_") in ESCALATING_CAPABILITIES})
    if not escalating:
        return []
    return [Violation(c.where, f"adds {', '.join(escalating)}, which grants SYS_ADMIN and lets it leave the GPU "
                               "fraction of its pod; remove it")]


def boundary_limit_env(c: _PodContainer) -> list[Violation]:
    return limit_env_outside_fractions(c.where, c.ref, c.fractions) if c.fraction is None else []


# In this order for each container, as a denial lists them.
_CONTAINER_BOUNDARIES: tuple[Callable[[_PodContainer], list[Violation]], ...] = (
    boundary_whole_gpus, boundary_mps_mounts, boundary_privileged, boundary_capabilities, boundary_limit_env)


def limit_env_outside_fractions(where: str, ref: podview.ContainerRef, fractions: PodFractions) -> list[Violation]:
    """A container beside the fractions may not see a GPU nor carry the limits' env."""
    out: list[Violation] = []
    for entry in podview.env(ref):
        name = entry["name"]
        if name == LimitEnv.VISIBLE_DEVICES and entry.get("value") not in NO_GPU_VALUES:
            out.append(Violation(where, f"sets {LimitEnv.VISIBLE_DEVICES} in a pod with GPU fractions; only "
                                        f"{' or '.join(NO_GPU_VALUES)} is allowed outside the fractional "
                                        f"containers ({', '.join(sorted(fractions.names()))})",))
        elif name.startswith(LIMIT_ENV_PREFIXES):
            out.append(Violation(where, f"sets {name}, which only the fractional containers carry, as gpufrac "
                                        "injects it"))
    return out


def check(review: PodReview) -> list[Violation]:
    return boundaries(review.obj, review.fractions, review.policy) if review.fractions.is_fractional else []


RULE = Rule(
    "boundaries", "no privileged container, host namespaces, SYS_ADMIN, whole GPUs, limit env or foreign MPS "
    "volumes beside a fraction",
    Scope.POD, Phase.FRACTIONAL, 290,
    check,
    cel(),
    webhook_only=("partly: " + _NODE + "; a hostPath written other than plainly (`..`, `//`, `/./`) and hostPath "
                  "delivery stay with the webhook"),
)
