"""kube-controller-manager and kube-scheduler: the real ReplicaSet, Deployment, DaemonSet, Job, token and
namespace controllers, and the default scheduler. Neither serves HTTPS (--secure-port=0): no fixed ports."""

from __future__ import annotations

from pathlib import Path

from e2e.toolkit.apiserver import SERVICE_CIDR
from e2e.toolkit.tools import kube_version

# The controllers a node without a cloud provider or node IPAM leaves off. 1.37 removed the cloud controllers from
# kube-controller-manager: `cloud-node-lifecycle` and `service-lb-controller` are unknown names there and stop it.
DISABLED_CONTROLLERS = ("nodeipam",)
DISABLED_BEFORE_1_37 = ("cloud-node-lifecycle", "service-lb-controller")


def disabled_controllers(version: str) -> tuple[str, ...]:
    """The controllers --controllers turns off on kube-controller-manager `version` ("1.36.3")."""
    major, minor = (int(part) for part in version.split(".")[:2])
    return DISABLED_CONTROLLERS + (DISABLED_BEFORE_1_37 if (major, minor) < (1, 37) else ())


def controller_manager_argv(binary: str, kubeconfig: Path, pki: Path, pod_cidr: str) -> list[str]:
    return [
        binary,
        f"--kubeconfig={kubeconfig}",
        # Each controller acts as its own service account (system:serviceaccount:kube-system:replicaset-
        # controller, ...), as in a real cluster: the webhook sees that user on pods it creates.
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-cidr={pod_cidr}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allocate-node-cidrs=false",
        "--leader-elect=false",
        "--secure-port=0",
        "--controllers=" + ",".join(["*", *(f"-{name}" for name in disabled_controllers(kube_version()))]),
        "--v=1",
    ]


def scheduler_argv(binary: str, kubeconfig: Path) -> list[str]:
    return [binary, f"--kubeconfig={kubeconfig}", "--leader-elect=false", "--secure-port=0", "--v=1"]
