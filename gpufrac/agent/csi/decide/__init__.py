"""The CSI door's decisions: whether and what to publish into a pod's volume. Pure."""
