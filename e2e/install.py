"""gpufrac installed on the real node the way a user installs it: `helm install` of charts/gpufrac with the
local cluster's values file, `helm upgrade`, `helm uninstall`."""

from __future__ import annotations

import os
import subprocess

from e2e.kubectl import KubectlResult
from e2e.names import CHART_DIR, RELEASE_NAMESPACE
from e2e.node import RealCluster
from e2e.toolkit.errors import ClusterError

RELEASE = "gpufrac"
LOCAL_VALUES = CHART_DIR / "values-local.yaml"


class Helm:
    def __init__(self, cluster: RealCluster) -> None:
        self.cluster = cluster
        home = cluster.workdir / "helm"
        self.env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfigs["admin"]),
                    "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
                    "HELM_DATA_HOME": str(home / "data")}

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> KubectlResult:
        assert self.cluster.tools is not None
        res = subprocess.run([self.cluster.tools.helm, *args], capture_output=True, text=True, timeout=timeout,
                             env=self.env)
        result = KubectlResult(res.returncode, res.stdout, res.stderr)
        if check and res.returncode != 0:
            raise ClusterError(f"helm {' '.join(args)} failed: {res.stderr.strip()}")
        return result

    def install(self, *values: str, wait: str = "5m") -> KubectlResult:
        """`helm install gpufrac charts/gpufrac -n gpufrac-system --create-namespace -f values-local.yaml`,
        waiting for the Deployment and the DaemonSet; `values`: more `--set k=v` pairs."""
        sets = [arg for v in values for arg in ("--set", v)]
        return self.run("install", RELEASE, str(CHART_DIR), "-n", RELEASE_NAMESPACE, "--create-namespace",
                        "-f", str(LOCAL_VALUES), *sets, "--wait", "--timeout", wait)

    def upgrade(self, *values: str, wait: str = "5m") -> KubectlResult:
        sets = [arg for v in values for arg in ("--set", v)]
        return self.run("upgrade", RELEASE, str(CHART_DIR), "-n", RELEASE_NAMESPACE, "-f", str(LOCAL_VALUES),
                        "--reuse-values", *sets, "--wait", "--timeout", wait)

    def uninstall(self, wait: str = "3m") -> KubectlResult:
        return self.run("uninstall", RELEASE, "-n", RELEASE_NAMESPACE, "--wait", "--timeout", wait)

    def installed(self) -> bool:
        return self.run("status", RELEASE, "-n", RELEASE_NAMESPACE, check=False).rc == 0
