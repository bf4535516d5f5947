"""A kubelet plugin, as the CSI and the DRA front doors both serve one (edge): its gRPC server on a unix socket, its
registration with the kubelet's plugin watcher, and the registration API's stubs, compiled once (protobuf refuses a
message name defined twice in one process). `dra-example-driver` starts every plugin through one helper likewise.

Layout the kubelet expects (node-driver-registrar and k8s.io/dynamic-resource-allocation/kubeletplugin alike):
  <kubelet dir>/plugins/<driver>/<kind>.sock          the plugin's own services, dialled by the kubelet
  <kubelet dir>/plugins_registry/<driver>-reg.sock    Registration, found by the kubelet's plugin watcher
"""
