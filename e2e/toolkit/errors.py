"""The harness's one error type."""


class ClusterError(RuntimeError):
    """A component failed to start or a setup step failed; the message carries the log tail."""


class ToolsMissingError(ClusterError):
    """etcd, kube-apiserver, helm, kubectl (or a node binary) is not available."""
