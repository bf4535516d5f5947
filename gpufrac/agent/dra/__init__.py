"""The DRA door: the kubelet plugin of driver gpu.gpufrac.io prepares ResourceClaims on the node's GPUs and publishes
its ResourceSlices (docs/architecture.md). Its service, its driver, its edges (gRPC, the API server, its files) and its
pure decisions (decide/)."""
