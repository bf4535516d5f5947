"""From a pod's annotations to what each of its containers asked for: one typed value per fractional container.

Pure. The values a pod's rules judge (docs/architecture.md, "One review"): `resolve` reads them with these readers
and runs the value rules of `rules/catalog/` on them, so the mutating and the validating webhook judge a pod the
same way.

Shaped like KAI's shared validator (kai-scheduler/KAI-Scheduler pkg/common/resources/gpu_sharing_validation.go):
one reader per source (the pod's containers, the pod-level shorthands, the per-container keys, the container the
shorthands apply to); one module each: `model` (the typed values), `read` (the readers), `build` (the fractions
from what was read). The rules are one module each in `rules/catalog/`. Unlike KAI, which stops at the first
error, every violation is collected. Where KAI judges the text (portion-limit digits, the strings its
admission writes and compares), so does gpufrac; where it judges a value, gpufrac reads the value the way KAI's
scheduler and binder do (binary64 for portions, exact bytes for quantities).
"""

from gpufrac.webhook.decide.fractions.build import (
    build_fractions,
    portion_container,
)
from gpufrac.webhook.decide.fractions.model import (
    COMPUTE_PORTION_RANGE,
    DEVICES_LIST,
    FRACTION_RANGE,
    LISTED_CONTAINERS,
    MAX_DEVICES,
    MAX_MIB,
    MEMORY_QUANTITY,
    PORTION_DIGITS,
    PORTION_LIMIT,
    TARGETING,
    WHOLE_MIB,
    Amount,
    ContainerFraction,
    ContainerKeys,
    ContainerRequest,
    Containers,
    Memory,
    PodFractions,
    PodRequest,
    Portion,
    Shorthands,
    Target,
)
from gpufrac.webhook.decide.fractions.read import (
    keyed_container,
    merged_keys,
    read_amount,
    read_compute_portion,
    read_container_keys,
    read_container_request,
    read_containers,
    read_devices,
    read_fraction,
    read_memory_limit,
    read_memory_mib,
    read_mode,
    read_num_devices,
    read_pod_request,
    read_portion_limit,
    read_shorthands,
    read_target,
    translate,
)

__all__ = [
    "COMPUTE_PORTION_RANGE",
    "DEVICES_LIST",
    "FRACTION_RANGE",
    "LISTED_CONTAINERS",
    "MAX_DEVICES",
    "MAX_MIB",
    "MEMORY_QUANTITY",
    "PORTION_DIGITS",
    "PORTION_LIMIT",
    "TARGETING",
    "WHOLE_MIB",
    "Amount",
    "ContainerFraction",
    "ContainerKeys",
    "ContainerRequest",
    "Containers",
    "Memory",
    "PodFractions",
    "PodRequest",
    "Portion",
    "Shorthands",
    "Target",
    "build_fractions",
    "keyed_container",
    "merged_keys",
    "portion_container",
    "read_amount",
    "read_compute_portion",
    "read_container_keys",
    "read_container_request",
    "read_containers",
    "read_devices",
    "read_fraction",
    "read_memory_limit",
    "read_memory_mib",
    "read_mode",
    "read_num_devices",
    "read_pod_request",
    "read_portion_limit",
    "read_shorthands",
    "read_target",
    "translate",
]
