"""The client's pinned-memory env, keyed by GPU UUID at creation (the NRI plugin). Pure.

The webhook writes `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<limit>M,…` into the pod spec at admission, before any GPU
is chosen, so it can only key by the client's index. An index names a GPU in the client's view: a process that
narrows `CUDA_VISIBLE_DEVICES` (tensor-parallel workers do) makes an entry name a GPU it cannot see, and CUDA then
drops every entry (NVIDIA's measurement, r615). The NRI plugin is the first place that knows the bound GPUs' UUIDs
for every spelling of `gpus.devices` (an index, a UUID, a CDI name, mapped through NVML), so it rewrites the
variable there, keyed by UUID. The daemon side holds the limit whatever the env says (mps_limits); this env is a
second layer, which can only lower it.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpufrac.core.contract import CanonicalFraction, LimitEnv, format_pinned_mem_limit_by_uuid, is_gpu_uuid


def uuid_keyed_pinned_env(fraction: CanonicalFraction, gpus: Sequence[str]) -> dict[str, str]:
    """`{CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: "GPU-a=4096M"}` for a fraction given these GPUs (as the plugin identifies
    them: UUIDs where NVML or the entry says so); {} when it declares no pinned limit or a GPU has no known UUID
    (NVML down and an index bound): the webhook's index-keyed value is left as it is."""
    if not fraction.pinned_mem_limit_mib or not gpus or not all(is_gpu_uuid(g) for g in gpus):
        return {}
    limit = max(fraction.pinned_mem_limit_mib.values())
    return {LimitEnv.PINNED_MEM_LIMIT: format_pinned_mem_limit_by_uuid(limit, gpus)}
