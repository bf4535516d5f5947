"""kube-controller-manager and kube-scheduler: the real ReplicaSet, Deployment, DaemonSet, Job, token and
namespace controllers, and the default scheduler. Neither serves HTTPS (--secure-port=0): no fixed ports."""

from __future__ import annotations

from pathlib import Path

from e2e.toolkit.apiserver import SERVICE_CIDR


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
        "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller",
        "--v=1",
    ]


def scheduler_argv(binary: str, kubeconfig: Path) -> list[str]:
    return [binary, f"--kubeconfig={kubeconfig}", "--leader-elect=false", "--secure-port=0", "--v=1"]
