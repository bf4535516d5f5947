"""containerd (Debian's 1.6) with runc and the CNI bridge, everything under the node's directory.

Settings that matter on this kind of machine (cgroup v1, root without CAP_SYS_RESOURCE):
restrict_oom_score_adj (else every sandbox fails: runc cannot set a negative oom_score_adj), cgroupfs (no
systemd), the snapshotters that cannot work here disabled, pod network namespaces under the state dir.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from e2e.toolkit.netns import NodeNetwork

CNI_BIN_DIR = "/usr/lib/cni"
NAMESPACE = "k8s.io"


class Containerd:
    def __init__(self, root: Path, pause_image: str, network: NodeNetwork) -> None:
        self.root = root
        self.pause_image = pause_image
        self.network = network

    @property
    def socket(self) -> Path:
        return self.root / "run" / "containerd.sock"

    @property
    def config_file(self) -> Path:
        return self.root / "config.toml"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    def write_config(self) -> None:
        for sub in ("lib", "run", "opt", "cni/net.d", "cni/ipam"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        self.config_file.write_text(f"""version = 2
root = "{self.root / 'lib'}"
state = "{self.root / 'run'}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{self.socket}"

[ttrpc]
  address = "{self.root / 'run' / 'containerd.sock.ttrpc'}"

[debug]
  address = "{self.root / 'run' / 'debug.sock'}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{self.root / 'opt'}"

[{cri}]
  sandbox_image = "{self.pause_image}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  disable_apparmor = true

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{self.cni_conf_dir}"
  max_conf_num = 1
""")
        # The pods' network: one bridge in the node's namespace, its gateway the node's side; no masquerading
        # (nothing leaves the machine), so no iptables rules of its own.
        conf = {
            "cniVersion": "0.4.0",
            "name": "gpufrac-pods",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.network.bridge,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.root / "cni" / "ipam"),
                        "ranges": [[{"subnet": self.network.pod_cidr}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (self.cni_conf_dir / "10-gpufrac.conflist").write_text(json.dumps(conf, indent=2))

    def argv(self) -> list[str]:
        return self.network.enter(["containerd", "--config", str(self.config_file), "--log-level", "warn"])

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(["ctr", "--address", str(self.socket), "--namespace", NAMESPACE, *args],
                              capture_output=True, text=True, timeout=timeout)

    def ready(self) -> bool:
        return self.socket.exists() and self.ctr("version", timeout=10).returncode == 0

    def import_image(self, archive: Path) -> str:
        res = self.ctr("images", "import", str(archive), timeout=300)
        if res.returncode != 0:
            raise RuntimeError(f"ctr images import {archive}: {res.stderr.strip()}")
        return res.stdout

    def images(self) -> list[str]:
        res = self.ctr("images", "list", "-q")
        return res.stdout.split()
