"""kube-proxy in the node's network namespace (iptables mode): pods reach ClusterIP Services, in particular
the `kubernetes` Service, which is how in-cluster clients (the agent, the certificate jobs) find the apiserver.
Conntrack sysctls are left alone (maxPerCore 0) and NodePorts listen on the node's address only."""

from __future__ import annotations

import json
from pathlib import Path

from e2e.toolkit.netns import NodeNetwork


def write_config(path: Path, kubeconfig: Path, network: NodeNetwork, node_name: str) -> None:
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node_name,
        "bindAddress": network.node_ip,
        "clusterCIDR": network.pod_cidr,
        "nodePortAddresses": [f"{network.node_ip}/32"],
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }
    path.write_text(json.dumps(config, indent=2))


def argv(binary: str, config: Path, network: NodeNetwork) -> list[str]:
    return network.enter([binary, f"--config={config}", "--v=1"])
