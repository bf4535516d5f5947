"""kubectl as one of the cluster's users: its kubeconfig, stdin, a timeout, and the result as data."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from e2e.names import REPO_ROOT
from e2e.toolkit.errors import ClusterError


@dataclass
class KubectlResult:
    rc: int
    stdout: str
    stderr: str

    def __iter__(self) -> Iterator[object]:  # (rc, stdout, stderr) = cp.kubectl(...)
        return iter((self.rc, self.stdout, self.stderr))

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


# kubectl bound to one user: (args..., input=..., check=...) -> KubectlResult (the e2e tests' alice/binder/admin).
Kubectl = Callable[..., KubectlResult]


def run_kubectl(binary: str, kubeconfig: Path, *args: str, user: str, input: str | None = None,
                timeout: float = 60, check: bool = False) -> KubectlResult:
    """`kubectl --kubeconfig=<kubeconfig> args...`; with `check`, a failure raises ClusterError naming `user`."""
    res = subprocess.run(
        [binary, f"--kubeconfig={kubeconfig}", *args],
        cwd=REPO_ROOT,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "KUBECTL_INTERACTIVE_DELETE": "false"},
    )
    if check and res.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)} (as {user}) failed: {res.stderr.strip()}")
    return KubectlResult(res.returncode, res.stdout, res.stderr)


def as_list(objects: list[dict]) -> str:
    """Objects as one `kubectl apply -f -` document."""
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
