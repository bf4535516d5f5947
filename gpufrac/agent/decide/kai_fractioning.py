"""KAI's gpu-fractioning operator on the node (KAI's `global.nvFractions.set=true`): its fractiond is a second NRI
plugin and its mpsd a second MPS manager, both handing out the GPUs gpufrac hands out, and both writing
gpu-fractioning.nvidia.com/Ready. gpufrac's agent stands down there. Pure.

Recognised by what its mpsd writes at start: the node label `gpu-fractioning.kai.scheduler/nvidia-driver-version.major`
(KAI gpu-fractioning, fm/mpsd; /work/shared/reference/kai-gpu-fractioning.md), or any label under its prefix.
"""

from __future__ import annotations

from collections.abc import Mapping

KAI_FRACTIONING_LABEL_PREFIX = "gpu-fractioning.kai.scheduler/"
KAI_FRACTIONING_PRESENT = "KaiGpuFractioningPresent"


def kai_fractioning(labels: Mapping[str, str]) -> tuple[str, str] | None:
    """(reason, message) where KAI's operator runs on the node; None where it does not."""
    found = sorted(key for key in labels if key.startswith(KAI_FRACTIONING_LABEL_PREFIX))
    if not found:
        return None
    return (KAI_FRACTIONING_PRESENT,
            f"KAI's gpu-fractioning operator runs on this node (node label {found[0]}): its NRI plugin and MPS daemon "
            "would hand out the GPUs gpufrac hands out, so gpufrac stands down here (not Ready, KAI's readiness "
            "conditions left to KAI's operator); set KAI's global.nvFractions.set=false, or keep gpufrac's agent off "
            "this node (agent.nodeSelector)")
