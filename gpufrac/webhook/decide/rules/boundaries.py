"""The CEL of the boundaries of a fraction (`validation._boundaries`) and of what the mutating webhook injects
(CSI delivery)."""

from __future__ import annotations

from collections.abc import Callable

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import (
    LIMIT_ENV_PREFIXES,
    MODE_ATTRIBUTE,
    NO_GPU_VALUES,
    SHM_MOUNT_PATH,
    SHM_SUBDIR,
    LimitEnv,
)
from gpufrac.webhook.decide import validation as va
from gpufrac.webhook.decide.cel import ann as a
from gpufrac.webhook.decide.cel import annotation_message, has_ann, lit, one, regex, show, str_list, when
from gpufrac.webhook.decide.mutation import injected_env, injected_mounts, volume_name
from gpufrac.webhook.decide.policy import Policy

_REGULAR = "(object.spec.containers + object.spec.?initContainers.orValue([]))"
_EPHEMERAL = "object.spec.?ephemeralContainers.orValue([])"


def _mode_dir(mode: str) -> str:
    """`contract.mps_pipe_dir` in CEL, from the setting mpsRoot."""
    return f"((variables.mpsRoot.endsWith('/') ? variables.mpsRoot : variables.mpsRoot + '/') + {lit(mode)})"


def _per_container(check: Callable[[str, str], tuple[str, str]]) -> str:
    """`check(c, where)` (a CEL condition-and-message pair builder) over the regular and init containers, then the
    ephemeral ones, each list of messages in the pod's order."""
    return (f"{_REGULAR}.filter(c, {check('c', 'false')[0]}).map(c, 'container ' + c.name + ': ' + "
            f"{check('c', 'false')[1]}) + {_EPHEMERAL}.filter(c, {check('c', 'true')[0]})"
            f".map(c, 'ephemeral container ' + c.name + ': ' + {check('c', 'true')[1]})")


def _is_fraction(c: str, ephemeral: str) -> str:
    return f"(!{ephemeral} && {c}.name in variables.fractional)"
CSI_USED = ": uses gpufrac's CSI driver "
CSI_WRITES = "; gpufrac writes the one volume each fractional container's mode needs (gpufrac-mps-<mode>)"
MPS_REACHED = ", the node's MPS directories; gpufrac mounts the right one into each fractional container"
GRANTS_SYS_ADMIN = ", which grants SYS_ADMIN and lets it leave the GPU fraction of its pod; remove it"


def cel_boundaries() -> str:
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
    dirs = f"[{', '.join(_mode_dir(str(m)) for m in ComputeMode)}, {_mode_dir(SHM_SUBDIR)}]"
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
            f"(m.name == {lit(volume_name(mode_))} && !({_is_fraction(c, ephemeral)} && {mode} == {lit(str(mode_))}))"
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
        return f"!{_is_fraction(c, ephemeral)} && size({selected}) > 0", message

    checks = [_per_container(check) for check in (whole, mounts, privileged, capabilities, env)]
    return when("size(variables.fractional) > 0", " + ".join([*host, foreign_csi, foreign_host, *checks]))


def cel_kai_older_sharing_mode() -> str:
    """`validation._kai_older_sharing_mode` on CREATE: the first sign of KAI's older GPU-sharing admission."""
    key = va.KAI_SHARED_GPU_CONFIGMAP
    by_annotation = one(annotation_message(lit(key), a(key), lit(
        "was written by KAI's admission in its older GPU-sharing mode, whose binder hands the GPU out through "
        "ConfigMaps (GPU_PORTION, NVIDIA_VISIBLE_DEVICES) and never writes the memory or gpus.devices annotations "
        f"gpufrac enforces, so this pod would start without its GPU or its limits: {va.KAI_SHARING_FIX}")))
    from_config_map = (f"c.?env.orValue([]).filter(e, e.name in {str_list(va.KAI_CONFIGMAP_ENV)} && "
                       "has(e.valueFrom) && has(e.valueFrom.configMapKeyRef))")
    source = show(from_config_map + "[0].valueFrom.configMapKeyRef.name")
    tail = lit(f", as KAI's admission in its older GPU-sharing mode writes it, which gpufrac cannot enforce: "
               f"{va.KAI_SHARING_FIX}")
    by_env = (f"{_REGULAR}.filter(c, size({from_config_map}) > 0).map(c, 'container ' + c.name + ': takes env ' + "
              f"{from_config_map}[0].name + ' from ConfigMap ' + {source} + {tail})")
    first = f"({has_ann(key)} ? {by_annotation} : size({by_env}) > 0 ? [{by_env}[0]] : [])"
    return when("oldObject == null && size(variables.fractional) > 0", first)


def cel_injection() -> str:
    """`validation._injection` on CREATE with CSI delivery: each fractional container carries exactly the env and
    mounts the mutating webhook injects."""
    out = []
    for mode in ComputeMode:
        expected_env = injected_env("<c>", mode, Policy())
        checks = []
        for entry in expected_env:
            last = f"c.?env.orValue([]).filter(e, e.name == {lit(entry['name'])})"
            if "value" in entry:
                value = _mode_dir(str(mode)) if entry["name"] == LimitEnv.PIPE_DIRECTORY else lit(entry["value"])
                same = f"(!has(e.valueFrom) && e.?value.orValue('') == {value})"
            else:
                before, _, after = entry["valueFrom"]["fieldRef"]["fieldPath"].partition("<c>")
                same = (f"(!has(e.value) && has(e.valueFrom.fieldRef) && !has(e.valueFrom.configMapKeyRef) && "
                        f"!has(e.valueFrom.secretKeyRef) && !has(e.valueFrom.resourceFieldRef) && "
                        f"e.valueFrom.fieldRef.?apiVersion.orValue('v1') == 'v1' && "
                        f"e.valueFrom.fieldRef.fieldPath == {lit(before)} + c.name + {lit(after)})")
            ok = f"(size({last}) > 0 && [{last}[size({last}) - 1]].all(e, {same}))"
            checks.append((lit(entry["name"]), ok))
        for mount in injected_mounts(mode, Policy()):
            path = _mode_dir(str(mode)) if mount["mountPath"] != SHM_MOUNT_PATH else lit(SHM_MOUNT_PATH)
            ok = (f"c.?volumeMounts.orValue([]).exists(m, m.name == {lit(mount['name'])} && m.mountPath == {path} && "
                  f"m.?subPath.orValue('') == {lit(mount.get('subPath', ''))} && !has(m.readOnly) && "
                  "!has(m.mountPropagation) && !has(m.subPathExpr) && !has(m.recursiveReadOnly))")
            checks.append((f"'the {mount['name']} volume mount at ' + {path}", ok))
        listing = "[" + ", ".join(f"({ok}) ? '' : {name}" for name, ok in checks) + "].filter(x, x != '')"
        out.append(f"{_REGULAR}.filter(c, c.name in variables.fractional && "
                   f"variables.modeOf[variables.names.indexOf(c.name)] == {lit(str(mode))} && size({listing}) > 0)"
                   f".map(c, 'container ' + c.name + ': lacks what gpufrac injects (' + {listing}.join(', ') + "
                   f"{lit('): the gpufrac mutating webhook did not run or its changes were undone')})")
    return when("oldObject == null && variables.csiDelivery && size(variables.kaiOlderSharingMode) == 0",
                " + ".join(out))
