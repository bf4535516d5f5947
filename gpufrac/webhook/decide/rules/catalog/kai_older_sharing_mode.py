"""The rule `kaiOlderSharingMode`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from typing import Any

from gpufrac.core.contract import LimitEnv
from gpufrac.webhook.decide import pod as podview
from gpufrac.webhook.decide.cel import ann as a
from gpufrac.webhook.decide.cel import annotation_message, has_ann, lit, one, show, str_list, when
from gpufrac.webhook.decide.errors import Violation, annotation, show_value
from gpufrac.webhook.decide.rules.context import PodReview
from gpufrac.webhook.decide.rules.parts import REGULAR
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope

# What KAI's admission writes in its older GPU-sharing mode (its `gpusharing` plugin: KAI <= 0.17, and later releases
# in any mode but NvFractions): a ConfigMap name prefix on the pod, and env from those ConfigMaps, which its binder
# fills at bind instead of writing the per-container memory and gpus.devices annotations gpufrac enforces.
KAI_SHARED_GPU_CONFIGMAP = "runai/shared-gpu-configmap"
KAI_CONFIGMAP_ENV = (str(LimitEnv.VISIBLE_DEVICES), "GPU_PORTION", "RUNAI_NUM_OF_GPUS")
KAI_SHARING_FIX = ("run KAI >= 0.18 in its NvFractions mode (Helm global.gpuSharingMode=NvFractions, which "
                   "global.nvFractions.set=true also selects), or turn KAI's GPU sharing off (global.gpuSharing=false; "
                   "global.gpuSharingMode=Disabled from 0.18); docs/kai.md lists the KAI versions and settings")
_BY_ANNOTATION = ("was written by KAI's admission in its older GPU-sharing mode, whose binder hands the GPU out "
                  "through ConfigMaps (GPU_PORTION, NVIDIA_VISIBLE_DEVICES) and never writes the memory or "
                  "gpus.devices annotations gpufrac enforces, so this pod would start without its GPU or its limits: "
                  f"{KAI_SHARING_FIX}")
_BY_ENV = (f", as KAI's admission in its older GPU-sharing mode writes it, which gpufrac cannot enforce: "
           f"{KAI_SHARING_FIX}")


def cel() -> str:
    """`kai_older_sharing_mode` on CREATE: the first sign of KAI's older GPU-sharing admission."""
    key = KAI_SHARED_GPU_CONFIGMAP
    by_annotation = one(annotation_message(lit(key), a(key), lit(_BY_ANNOTATION)))
    from_config_map = (f"c.?env.orValue([]).filter(e, e.name in {str_list(KAI_CONFIGMAP_ENV)} && "
                       "has(e.valueFrom) && has(e.valueFrom.configMapKeyRef))")
    source = show(from_config_map + "[0].valueFrom.configMapKeyRef.name")
    tail = lit(_BY_ENV)
    by_env = (f"{REGULAR}.filter(c, size({from_config_map}) > 0).map(c, 'container ' + c.name + ': takes env ' + "
              f"{from_config_map}[0].name + ' from ConfigMap ' + {source} + {tail})")
    first = f"({has_ann(key)} ? {by_annotation} : size({by_env}) > 0 ? [{by_env}[0]] : [])"
    return when("oldObject == null && size(variables.fractional) > 0", first)


def kai_older_sharing_mode(obj: dict[str, Any]) -> list[Violation]:
    """A pod KAI's older GPU-sharing admission mutated: its GPU would come from ConfigMaps gpufrac does not know,
    with no memory limit, so it is denied with the KAI setting to change (instead of "did not run")."""
    prefix = podview.annotations(obj).get(KAI_SHARED_GPU_CONFIGMAP)
    if prefix is not None:
        return [annotation(KAI_SHARED_GPU_CONFIGMAP, prefix, _BY_ANNOTATION)]
    for ref in podview.containers(obj, podview.ContainerKind.CONTAINER, podview.ContainerKind.INIT):
        for entry in podview.env(ref):
            source = (entry.get("valueFrom") or {}).get("configMapKeyRef")
            if entry.get("name") in KAI_CONFIGMAP_ENV and isinstance(source, dict):
                return [Violation(f"container {ref.name}", f"takes env {entry['name']} from ConfigMap "
                                  f"{show_value(str(source.get('name')))}{_BY_ENV}")]
    return []


def applies(review: PodReview) -> bool:
    """On a fractional pod's CREATE, once mutated (not on a workload's template)."""
    return review.old is None and not review.template and review.fractions.is_fractional


def check(review: PodReview) -> list[Violation]:
    return kai_older_sharing_mode(review.obj) if applies(review) else []


RULE = Rule(
    "kaiOlderSharingMode", "no pod KAI's older GPU-sharing admission mutated",
    Scope.CREATE, Phase.FRACTIONAL, 270,
    check,
    cel(),
)
