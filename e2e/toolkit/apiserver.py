"""kube-apiserver: its command line for the API-only cluster and for the real node."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SERVICE_CIDR = "10.96.0.0/24"


@dataclass(frozen=True)
class ApiserverConfig:
    binary: str
    etcd_url: str
    pki: Path
    bind_address: str
    port: int
    # The real node: the apiserver dials webhook Services through their endpoints (no kube-proxy on its side),
    # and has a client certificate for the kubelet (logs, exec).
    real_node: bool = False


def argv(cfg: ApiserverConfig) -> list[str]:
    pki = cfg.pki
    args = [
        cfg.binary,
        f"--etcd-servers={cfg.etcd_url}",
        f"--bind-address={cfg.bind_address}",
        f"--advertise-address={cfg.bind_address}",
        f"--secure-port={cfg.port}",
        f"--tls-cert-file={pki / 'tls.crt'}",
        f"--tls-private-key-file={pki / 'tls.key'}",
        f"--token-auth-file={pki / 'tokens.csv'}",
        "--authorization-mode=Node,RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # Privileged containers must reach admission: the "no privileged fractional container" rule is ours to
        # enforce (and to test); with the default false the apiserver itself would refuse them first.
        "--allow-privileged=true",
        # The default plugin set stays (NamespaceLifecycle, LimitRanger, ServiceAccount, PodSecurity, Priority,
        # DefaultTolerationSeconds, ..., MutatingAdmissionWebhook, ValidatingAdmissionWebhook, ResourceQuota),
        # so the webhook sees pods the way a real cluster hands them over: in particular ServiceAccount stays ON
        # and adds the kube-api-access projected volume and mount before our webhook patches volumes/mounts.
        # NodeRestriction belongs with the Node authorizer.
        "--enable-admission-plugins=NodeRestriction,MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
        "--profiling=false",
        "--v=1",
    ]
    if cfg.real_node:
        args += [
            "--enable-aggregator-routing=true",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
        ]
    else:
        # Nothing routes service IPs here; the webhook is registered by URL.
        args.append("--endpoint-reconciler-type=none")
    return args


def url(cfg: ApiserverConfig) -> str:
    return f"https://{cfg.bind_address}:{cfg.port}"
