"""The DRA kubelet plugin of driver gpu.gpufrac.io: its gRPC services, its sockets, its API objects, its files."""
