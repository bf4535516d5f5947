"""The rule `injection`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

import functools
from typing import Any

from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import (
    SHM_MOUNT_PATH,
    LimitEnv,
)
from gpufrac.webhook.decide import pod as podview
from gpufrac.webhook.decide.cel import lit, when
from gpufrac.webhook.decide.errors import Violation
from gpufrac.webhook.decide.fractions import PodFractions
from gpufrac.webhook.decide.mutation import injected_env, injected_mounts, injected_volumes
from gpufrac.webhook.decide.policy import Policy
from gpufrac.webhook.decide.rules.catalog.kai_older_sharing_mode import applies, kai_older_sharing_mode
from gpufrac.webhook.decide.rules.context import PodReview
from gpufrac.webhook.decide.rules.parts import REGULAR, mode_dir
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope


def cel() -> str:
    """`injection` on CREATE with CSI delivery: each fractional container carries exactly the env and
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


@functools.lru_cache(maxsize=256)
def _expected_env(container: str, mode: ComputeMode, policy: Policy) -> tuple[dict[str, Any], ...]:
    """What the mutation injects, to compare with (never written into a pod: shared between reviews)."""
    return tuple(injected_env(container, mode, policy))


@functools.lru_cache(maxsize=16)
def _expected_mounts(mode: ComputeMode, policy: Policy) -> tuple[tuple[dict[str, Any], dict[str, Any]], ...]:
    """(mount, the pod volume it mounts) the mutation injects for a container of this mode, to compare with."""
    volumes = {v["name"]: v for v in injected_volumes(mode, policy)}
    return tuple((mount, volumes[mount["name"]]) for mount in injected_mounts(mode, policy))


def injection(obj: dict[str, Any], fractions: PodFractions, policy: Policy) -> list[Violation]:
    """Each fractional container carries exactly the env and mount the mutating webhook injects."""
    out: list[Violation] = []
    volumes = {v["name"]: v for v in podview.volumes(obj)}
    for ref in podview.containers(obj, podview.ContainerKind.CONTAINER, podview.ContainerKind.INIT):
        fraction = fractions.containers.get(ref.name)
        if fraction is None:
            continue
        env = {e["name"]: e for e in podview.env(ref)}
        mounts = podview.volume_mounts(ref)
        missing = [w["name"] for w in _expected_env(ref.name, fraction.mode, policy) if env.get(w["name"]) != w]
        for mount, volume in _expected_mounts(fraction.mode, policy):
            if mount not in mounts or volumes.get(mount["name"]) != volume:
                missing.append(f"the {mount['name']} volume mount at {mount['mountPath']}")
        if missing:
            out.append(Violation(f"container {ref.name}", f"lacks what gpufrac injects ({', '.join(missing)}): the "
                                 "gpufrac mutating webhook did not run or its changes were undone"))
    return out


def check(review: PodReview) -> list[Violation]:
    """What KAI's older mode changed would otherwise read as gpufrac's injection undone: that rule names the cause,
    this one stays silent."""
    if not applies(review) or kai_older_sharing_mode(review.obj):
        return []
    return injection(review.obj, review.fractions, review.policy)


RULE = Rule(
    "injection", "each fractional container carries the env and mounts gpufrac injects",
    Scope.CREATE, Phase.FRACTIONAL, 280,
    check,
    cel(),
    webhook_only="partly: with hostPath delivery (mps.delivery) the policies leave it to the webhook",
)
