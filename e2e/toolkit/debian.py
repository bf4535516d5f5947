"""Debian packages the real node needs, installed with apt-get when missing (CI machines start bare)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from e2e.toolkit.errors import ToolsMissingError

# package -> a file it installs
# (containerd and runc are built from the module proxy: e2e/build-tools.sh node)
NODE_PACKAGES = {
    "containernetworking-plugins": "/usr/lib/cni/bridge",
    "iptables": "/usr/sbin/iptables",
}


def ensure_packages(packages: dict[str, str], say=print) -> None:
    missing = [pkg for pkg, path in packages.items() if not Path(path).exists()]
    if not missing:
        return
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise ToolsMissingError(f"the real node needs the Debian packages {', '.join(missing)} (apt-get as root)")
    say(f"installing Debian packages: {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    res = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
                         capture_output=True, text=True, env=env)
    if res.returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env)
        res = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
                             capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise ToolsMissingError(f"apt-get install {' '.join(missing)} failed: {res.stderr.strip()[-1000:]}")
