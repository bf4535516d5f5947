"""A local Kubernetes control plane (etcd + kube-apiserver + the gpufrac webhook) for end-to-end tests and
demos.

`python -m e2e up|down|status|demo`; see `e2e.cluster.ControlPlane`.
"""

from e2e.cluster import ClusterError, ControlPlane, Tools, ToolsMissingError

__all__ = ["ClusterError", "ControlPlane", "Tools", "ToolsMissingError"]
