"""The rule `injection`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import (
    SHM_MOUNT_PATH,
    LimitEnv,
)
from gpufrac.webhook.decide import validation as va
from gpufrac.webhook.decide.cel import lit, when
from gpufrac.webhook.decide.mutation import injected_env, injected_mounts
from gpufrac.webhook.decide.policy import Policy
from gpufrac.webhook.decide.rules.parts import REGULAR, mode_dir
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope


def cel() -> str:
    """`validation._injection` on CREATE with CSI delivery: each fractional container carries exactly the env and
    mounts the mutating webhook injects."""
    out = []
    for mode in ComputeMode:
        expected_env = injected_env("<c>", mode, Policy())
        checks = []
        for entry in expected_env:
            last = f"c.?env.orValue([]).filter(e, e.name == {lit(entry['name'])})"
            if "value" in entry:
                value = mode_dir(str(mode)) if entry["name"] == LimitEnv.PIPE_DIRECTORY else lit(entry["value"])
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
            path = mode_dir(str(mode)) if mount["mountPath"] != SHM_MOUNT_PATH else lit(SHM_MOUNT_PATH)
            ok = (f"c.?volumeMounts.orValue([]).exists(m, m.name == {lit(mount['name'])} && m.mountPath == {path} && "
                  f"m.?subPath.orValue('') == {lit(mount.get('subPath', ''))} && !has(m.readOnly) && "
                  "!has(m.mountPropagation) && !has(m.subPathExpr) && !has(m.recursiveReadOnly))")
            checks.append((f"'the {mount['name']} volume mount at ' + {path}", ok))
        listing = "[" + ", ".join(f"({ok}) ? '' : {name}" for name, ok in checks) + "].filter(x, x != '')"
        out.append(f"{REGULAR}.filter(c, c.name in variables.fractional && "
                   f"variables.modeOf[variables.names.indexOf(c.name)] == {lit(str(mode))} && size({listing}) > 0)"
                   f".map(c, 'container ' + c.name + ': lacks what gpufrac injects (' + {listing}.join(', ') + "
                   f"{lit('): the gpufrac mutating webhook did not run or its changes were undone')})")
    return when("oldObject == null && variables.csiDelivery && size(variables.kaiOlderSharingMode) == 0",
                " + ".join(out))


RULE = Rule(
    "injection", "each fractional container carries the env and mounts gpufrac injects",
    Scope.CREATE, Phase.FRACTIONAL, 280,
    (va.injection,),
    cel(),
    webhook_only="partly: with hostPath delivery (mps.delivery) the policies leave it to the webhook",
)
