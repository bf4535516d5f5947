"""The CSI door: the agent's CSI node plugin mounts each mode's MPS directories into fractional pods, registered with
the kubelet through the kubelet plugin (kubelet_plugin). Its service, its edges and its pure decisions (decide/)."""
