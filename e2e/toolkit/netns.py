"""The node's network: a network namespace of its own, joined to the host by a veth pair.

containerd (so the CNI bridge and the pods), the kubelet and kube-proxy run inside it (entered with nsenter,
the mount namespace stays the host's): the bridge, kube-proxy's iptables rules, ip_forward and the kubelet's
ports 10250/10248 never touch the host's network. The host side of the veth carries the apiserver's address,
and a host route sends pod traffic (the apiserver dialling webhook pods, kubectl exec) into the namespace.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from e2e.toolkit.errors import ClusterError


@dataclass(frozen=True)
class NodeNetwork:
    netns: str = "gpufrac-node"
    host_if: str = "gfn-host"
    node_if: str = "gfn-node"
    host_ip: str = "10.250.0.1"
    node_ip: str = "10.250.0.2"
    prefix: int = 24
    pod_cidr: str = "10.244.0.0/24"
    bridge: str = "gpufrac0"

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.netns}"

    def enter(self, argv: list[str]) -> list[str]:
        """`argv` run inside the node's network namespace."""
        return ["nsenter", f"--net={self.netns_path}", "--", *argv]

    def create(self) -> None:
        self.destroy()
        for cmd in (
            ["ip", "netns", "add", self.netns],
            ["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.node_if],
            ["ip", "link", "set", self.node_if, "netns", self.netns],
            ["ip", "addr", "add", f"{self.host_ip}/{self.prefix}", "dev", self.host_if],
            ["ip", "link", "set", self.host_if, "up"],
            ["ip", "-n", self.netns, "addr", "add", f"{self.node_ip}/{self.prefix}", "dev", self.node_if],
            ["ip", "-n", self.netns, "link", "set", self.node_if, "up"],
            ["ip", "-n", self.netns, "link", "set", "lo", "up"],
            # The node's default route points at the host side, as a node's points at its gateway.
            ["ip", "-n", self.netns, "route", "add", "default", "via", self.host_ip],
            ["ip", "route", "add", self.pod_cidr, "via", self.node_ip, "dev", self.host_if],
        ):
            _ip(cmd)

    def destroy(self) -> None:
        """Remove the namespace (the bridge and the pods' veths go with it), the veth pair and the route."""
        subprocess.run(["ip", "route", "del", self.pod_cidr], capture_output=True)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)

    def exists(self) -> bool:
        return subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True).returncode == 0


def _ip(cmd: list[str]) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise ClusterError(f"{' '.join(cmd)} failed: {res.stderr.strip()}")
