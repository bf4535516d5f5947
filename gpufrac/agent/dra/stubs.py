"""The generated gRPC modules of the kubelet's DRA v1 service (hack/grpc-stubs.sh writes them at build and test
time; they are not committed). The kubelet's registration API is the kubelet plugin's own (kubelet_plugin.stubs)."""

from __future__ import annotations

from gpufrac.agent.decide.errors import ConfigError

try:
    from gpufrac.agent.dra.generated import dra_pb2, dra_pb2_grpc
except ImportError as err:  # a source checkout where the stubs were never generated
    raise ConfigError(
        f"the DRA gRPC stubs are missing ({err}): run `make stubs` (hack/grpc-stubs.sh) to generate them from the "
        "kubelet's dra/v1 api.proto"
    ) from err

__all__ = ["dra_pb2", "dra_pb2_grpc"]
