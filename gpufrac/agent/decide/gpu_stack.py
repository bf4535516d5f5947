"""Which containers are the GPU stack's own (NVIDIA's device plugin, GPU feature discovery, the DCGM exporter,
gpufrac's agent and MPS daemons): they hold every GPU through `NVIDIA_VISIBLE_DEVICES=all` in their image and their
env, and voiding it would take `nvidia.com/gpu` off the node at their next restart. Pure.

Recognised by what they are: a trusted namespace (NVIDIA's own by default), or a bind of the kubelet's
device-plugins directory, through which any device plugin registers (a hostPath: only a privileged pod has it, and
such a pod could take a GPU anyway).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

DEVICE_PLUGINS_DIR = "/var/lib/kubelet/device-plugins"  # the kubelet's, fixed whatever its --root-dir

# NVIDIA's namespaces: its standalone device plugin's README, the GPU Operator's, OpenShift's operator's
NVIDIA_STACK_NAMESPACES = frozenset({"nvidia-device-plugin", "gpu-operator", "nvidia-gpu-operator"})
DEFAULT_TRUSTED_NAMESPACES = frozenset({"kube-system", *NVIDIA_STACK_NAMESPACES})


def is_gpu_stack(namespace: str, mount_sources: Iterable[str], trusted_namespaces: Iterable[str],
                 stack_host_dirs: Iterable[str] = (DEVICE_PLUGINS_DIR,)) -> bool:
    if namespace in set(trusted_namespaces):
        return True
    tops = [top.rstrip("/") for top in stack_host_dirs]
    return any(source.rstrip("/") == top or source.startswith(top + "/") for source in mount_sources for top in tops)


VOIDED_DAEMONSET_REASON = "DaemonSetGpuEnvVoided"  # the Event on a DaemonSet's pod whose GPU env gpufrac voided
# The DaemonSet controller labels its pods with their template's generation (no other controller does); the
# runtime hands the plugin the pod's labels with its sandbox
DAEMONSET_POD_LABEL = "pod-template-generation"


def daemonset_pod(labels: Mapping[str, str]) -> bool:
    """A node-wide component's pod (a device plugin, a monitoring agent): its voided or refused GPU env is the sign
    of a GPU stack gpufrac did not recognise."""
    return DAEMONSET_POD_LABEL in labels


def voided_daemonset_message(container: str, note: str) -> str:
    return (f"container {container} of a DaemonSet's pod: {note}. If it is the GPU stack's own (a device plugin, GPU "
            "feature discovery, a DCGM exporter), add its namespace to the chart's nri.trustedNamespaces: at its "
            "next restart it would otherwise lose its GPUs")
