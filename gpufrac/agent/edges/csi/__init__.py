"""The agent's CSI node plugin: Identity and Node services that mount each mode's MPS directories into fractional
pods, registered with the kubelet through its plugin registration socket."""
