"""What the NRI plugin answers for an sm-sharing fraction once it has asked the agent to tell the MPS daemon its
limits (Agent.hold_now): a refusal where the daemon could not be told, its own MPS v3 namespace's directory as its
pipe directory where the daemon has one for it (decide.mps_namespaces). Pure."""

from __future__ import annotations

from dataclasses import replace

from gpufrac.agent.nri.decide.creation import BindMount, ContainerInfo, Injection, PodInfo, Refusal, RefusalReason
from gpufrac.core.contract import LimitEnv


def daemon_limits_refusal(pod: PodInfo, container: ContainerInfo, why_not: str) -> Refusal:
    """An sm-sharing fraction whose limits the MPS daemon did not take before its creation was answered."""
    return Refusal(RefusalReason.DAEMON_LIMITS_NOT_SET,
                   f"container {container.name} of pod {pod} is an sm-sharing GPU fraction, but the MPS daemon could "
                   f"not be told its limits ({why_not}): without them a process that drops its env would have the "
                   "whole GPU; the kubelet creates it again")


def own_pipe_dir(injection: Injection, container: ContainerInfo, namespace_dir: str) -> Injection:
    """An sm-sharing fraction whose MPS v3 namespace the daemon has: that namespace's directory (one socket, its own
    limits) replaces the mode's whole pipe directory at the container's CUDA_MPS_PIPE_DIRECTORY, so its processes
    reach no other namespace, server or control socket (decide.mps_namespaces)."""
    pipe = container.env.get(LimitEnv.PIPE_DIRECTORY, "").strip()
    if not pipe:
        return injection  # refused before this by creation_escapes.pipe_dir_problem, where mounts are told
    return replace(injection, mounts=(BindMount(namespace_dir, pipe),),
                   note=f"{injection.note}; its pipe directory is its own MPS namespace's, {namespace_dir}")
