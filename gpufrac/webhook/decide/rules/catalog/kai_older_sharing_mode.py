"""The rule `kaiOlderSharingMode`: the webhook's Python check, its CEL for the policies, its messages."""

from __future__ import annotations

from gpufrac.webhook.decide import validation as va
from gpufrac.webhook.decide.cel import ann as a
from gpufrac.webhook.decide.cel import annotation_message, has_ann, lit, one, show, str_list, when
from gpufrac.webhook.decide.rules.parts import REGULAR
from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope


def cel() -> str:
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
    by_env = (f"{REGULAR}.filter(c, size({from_config_map}) > 0).map(c, 'container ' + c.name + ': takes env ' + "
              f"{from_config_map}[0].name + ' from ConfigMap ' + {source} + {tail})")
    first = f"({has_ann(key)} ? {by_annotation} : size({by_env}) > 0 ? [{by_env}[0]] : [])"
    return when("oldObject == null && size(variables.fractional) > 0", first)


RULE = Rule(
    "kaiOlderSharingMode", "no pod KAI's older GPU-sharing admission mutated",
    Scope.CREATE, Phase.FRACTIONAL, 270,
    (va.kai_older_sharing_mode,),
    cel(),
)
