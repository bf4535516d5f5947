"""The kubelet (v1.36 from the module proxy) on cgroup v1 with containerd 2.

failCgroupV1: false (1.35+ refuses cgroup v1 otherwise) and cgroupDriver: cgroupfs set explicitly (the same as
containerd's runc with SystemdCgroup = false; a runtime that cannot report its driver gets it from here). The
kubelet ignores a misspelled field (it only logs `strict decoding failed` at INFO): `config_problems` greps its
log for that.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from e2e.toolkit.netns import NodeNetwork


class Kubelet:
    def __init__(self, binary: str, root: Path, network: NodeNetwork, node_name: str, runtime_socket: Path,
                 kubeconfig: Path, ca_file: Path, labels: dict[str, str]) -> None:
        self.binary, self.root, self.network, self.node_name = binary, root, network, node_name
        self.runtime_socket, self.kubeconfig, self.ca_file, self.labels = runtime_socket, kubeconfig, ca_file, labels

    @property
    def root_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def config_file(self) -> Path:
        return self.root / "kubelet-config.json"

    def prepare(self) -> None:
        """The root dir bound onto itself and made rshared: volume mounts below it propagate to containers
        (the host's / is a private mount here, and is never touched)."""
        self.root_dir.mkdir(parents=True, exist_ok=True)
        (self.root / "pod-logs").mkdir(parents=True, exist_ok=True)
        (self.root / "volume-plugins").mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "--bind", str(self.root_dir), str(self.root_dir)], check=True)
        subprocess.run(["mount", "--make-rshared", str(self.root_dir)], check=True)
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "failSwapOn": False,
            "address": self.network.node_ip,
            "healthzBindAddress": "127.0.0.1",
            "containerRuntimeEndpoint": f"unix://{self.runtime_socket}",
            "podLogsDir": str(self.root / "pod-logs"),
            "volumePluginDir": str(self.root / "volume-plugins"),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.ca_file)},
            },
            "authorization": {"mode": "Webhook"},
            # No iptables from the kubelet; nothing here masquerades.
            "makeIPTablesUtilChains": False,
            "resolvConf": "/etc/resolv.conf",
            # A shared CI disk: never evict the tests' pods or garbage-collect the imported images. Absolute floors,
            # not 1 %: that is 2.5 GB of a 252 GB disk whose free space is not ours to keep, and under DiskPressure
            # no pod starts.
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "100Mi", "imagefs.available": "100Mi",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "nodeStatusReportFrequency": "10s",
            "syncFrequency": "10s",
        }
        self.config_file.write_text(json.dumps(config, indent=2))

    def argv(self) -> list[str]:
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        return self.network.enter([
            self.binary,
            f"--config={self.config_file}",
            f"--kubeconfig={self.kubeconfig}",
            f"--root-dir={self.root_dir}",
            f"--cert-dir={self.root / 'kubelet-pki'}",
            f"--node-ip={self.network.node_ip}",
            f"--hostname-override={self.node_name}",
            f"--node-labels={labels}",
            "--v=1",
        ])

    @staticmethod
    def config_problems(log: Path) -> list[str]:
        try:
            text = log.read_text(errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if "strict decoding" in line]
