"""A local Kubernetes control plane (etcd + kube-apiserver + the gpufrac webhook) for end-to-end tests and
demos.

`python -m e2e up|down|status|demo`; see `e2e.cluster.ControlPlane`.
"""

from e2e.cluster import ControlPlane
from e2e.toolkit.errors import ClusterError, ToolsMissingError
from e2e.toolkit.tools import Tools

__all__ = ["ClusterError", "ControlPlane", "Tools", "ToolsMissingError"]
