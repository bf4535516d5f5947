"""containerd 2 (built from the module proxy by e2e/build-tools.sh node) with runc and the CNI bridge, everything
under the node's directory; NRI on a socket of the node's own, CDI specs read from the node's own directory.

Settings that matter on this kind of machine (cgroup v1, root without CAP_SYS_RESOURCE):
restrict_oom_score_adj (else every sandbox fails: runc cannot set a negative oom_score_adj), cgroupfs (no
systemd), the snapshotters that cannot work here disabled, pod network namespaces under the state dir, runc's
state under the node's directory. Only the shims' sockets stay machine-wide (/run/containerd/s, hard-coded in
containerd): e2e.node removes the ones its shims listened on.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from e2e.toolkit.errors import ToolsMissingError
from e2e.toolkit.netns import NodeNetwork
from e2e.toolkit.tools import find_binary

CNI_BIN_DIR = "/usr/lib/cni"
NAMESPACE = "k8s.io"
# Machine-wide, hard-coded in containerd 2 (pkg/shim: defaults.DefaultStateDir + "/s").
SHIM_SOCKET_DIR = "/run/containerd/s"


def daemon_config(root: Path, socket: Path, debug_level: str = "") -> str:
    """The first lines of a containerd 2 config (version 3): its own directories and sockets under `root`, and the
    snapshotters and tracing this machine cannot use turned off."""
    level = f"\n  level = '{debug_level}'" if debug_level else ""
    return f"""version = 3
root = '{root / 'lib'}'
state = '{root / 'run'}'
disabled_plugins = ['io.containerd.snapshotter.v1.btrfs', 'io.containerd.snapshotter.v1.zfs',
                    'io.containerd.snapshotter.v1.aufs', 'io.containerd.snapshotter.v1.devmapper',
                    'io.containerd.snapshotter.v1.erofs', 'io.containerd.tracing.processor.v1.otlp',
                    'io.containerd.internal.v1.tracing']

[grpc]
  address = '{socket}'

[ttrpc]
  address = '{root / 'run' / 'containerd.sock.ttrpc'}'

[debug]
  address = '{root / 'run' / 'debug.sock'}'{level}
"""


class Containerd:
    def __init__(self, root: Path, pause_image: str, network: NodeNetwork, *, nri: bool = True,
                 nri_required_plugins: Sequence[str] = (), nri_tolerate_annotation: str = "") -> None:
        """`nri_required_plugins`: NRI's default validator refuses containers while one of them is not
        connected, except in pods annotated `nri_tolerate_annotation: "true"`."""
        self.root = root
        self.pause_image = pause_image
        self.network = network
        self.nri = nri
        self.nri_required_plugins = tuple(nri_required_plugins)
        self.nri_tolerate_annotation = nri_tolerate_annotation

    @staticmethod
    def binary(name: str) -> str:
        """containerd, containerd-shim-runc-v2, ctr or runc from the tools cache."""
        path = find_binary(name)
        if path is None:
            raise ToolsMissingError(f"{name} is not in the tools cache: build it with `make tools` "
                                    "(bash e2e/build-tools.sh node)")
        return path

    @property
    def socket(self) -> Path:
        return self.root / "run" / "containerd.sock"

    @property
    def nri_socket(self) -> Path:
        """Where NRI plugins connect (containerd makes its directory, mode 0700)."""
        return self.root / "nri" / "nri.sock"

    @property
    def cdi_dir(self) -> Path:
        """The one directory containerd reads CDI specs from (cdi_spec_dirs)."""
        return self.root / "cdi"

    @property
    def config_file(self) -> Path:
        return self.root / "config.toml"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    def write_config(self) -> None:
        for sub in ("lib", "run", "opt", "cdi", "cni/net.d", "cni/ipam"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        runtime = "plugins.'io.containerd.cri.v1.runtime'"
        self.config_file.write_text(f"""{daemon_config(self.root, self.socket)}
[plugins.'io.containerd.internal.v1.opt']
  path = '{self.root / 'opt'}'

[plugins.'io.containerd.nri.v1.nri']
  disable = {str(not self.nri).lower()}
  socket_path = '{self.nri_socket}'
{self._nri_validator()}
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = '{self.pause_image}'

[{runtime}]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  disable_apparmor = true
  cdi_spec_dirs = ['{self.cdi_dir}']

[{runtime}.containerd]
  default_runtime_name = 'runc'

[{runtime}.containerd.runtimes.runc]
  runtime_type = 'io.containerd.runc.v2'

[{runtime}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = '{self.binary("runc")}'
  Root = '{self.root / 'run' / 'runc'}'

[{runtime}.cni]
  bin_dirs = ['{CNI_BIN_DIR}']
  conf_dir = '{self.cni_conf_dir}'
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

    def _nri_validator(self) -> str:
        if not self.nri_required_plugins:
            return ""
        return (f"""
[plugins.'io.containerd.nri.v1.nri'.default_validator]
  enable = true
  required_plugins = {json.dumps(list(self.nri_required_plugins))}
  tolerate_missing_plugins_annotation = {json.dumps(self.nri_tolerate_annotation)}
""")

    def argv(self) -> list[str]:
        return self.network.enter([self.binary("containerd"), "--config", str(self.config_file),
                                   "--log-level", "warn"])

    def env(self) -> dict[str, str]:
        """containerd finds its shim on PATH: the tools cache's bin directory first."""
        bin_dir = os.path.dirname(self.binary("containerd-shim-runc-v2"))
        return {**os.environ, "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "/usr/sbin:/usr/bin")])}

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([self.binary("ctr"), "--address", str(self.socket), "--namespace", NAMESPACE,
                               *args], capture_output=True, text=True, timeout=timeout)

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
