"""The rule `boundaries`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import (
    LIMIT_ENV_PREFIXES,
    MODE_ATTRIBUTE,
    NO_GPU_VALUES,
    SHM_SUBDIR,
    LimitEnv,
)
from gpufrac.webhook.decide import validation as va
from gpufrac.webhook.decide.cel import lit, one, regex, str_list, when
from gpufrac.webhook.decide.mutation import volume_name
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

_NODE = "needs the node's facts (the MPS directories as the node resolves host paths)"


def cel() -> str:
    """`validation._boundaries`, but a hostPath into the MPS directories written other than plainly (`..`, `//`,
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

    escalating = str_list(sorted({*va.ESCALATING_CAPABILITIES, *(f"CAP_{x}" for x in va.ESCALATING_CAPABILITIES)}))

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


RULE = Rule(
    "boundaries", "no privileged container, host namespaces, SYS_ADMIN, whole GPUs, limit env or foreign MPS "
    "volumes beside a fraction",
    Scope.POD, Phase.FRACTIONAL, 290,
    (va.boundaries, va.boundary_host_namespaces, va.boundary_foreign_volumes, va.foreign_mps_volume,
     va.boundary_whole_gpus, va.boundary_mps_mounts, va.boundary_privileged, va.boundary_capabilities,
     va.boundary_limit_env, va.limit_env_outside_fractions),
    cel(),
    webhook_only=("partly: " + _NODE + "; a hostPath written other than plainly (`..`, `//`, `/./`) and hostPath "
                  "delivery stay with the webhook"),
)
