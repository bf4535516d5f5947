"""The generated gRPC modules (hack/grpc-stubs.sh writes them at build and test time; they are not committed): the
kubelet's DRA v1 service, and the plugin registration service the CSI plugin uses too (one compiled copy: protobuf
refuses a message name defined twice in one process)."""

from __future__ import annotations

from gpufrac.agent.decide.errors import ConfigError

try:
    from gpufrac.agent.edges.csi.generated import pluginregistration_pb2, pluginregistration_pb2_grpc
    from gpufrac.agent.edges.dra.generated import dra_pb2, dra_pb2_grpc
except ImportError as err:  # a source checkout where the stubs were never generated
    raise ConfigError(
        f"the DRA gRPC stubs are missing ({err}): run `make stubs` (hack/grpc-stubs.sh) to generate them from the "
        "kubelet's dra/v1 and pluginregistration api.proto"
    ) from err

__all__ = ["dra_pb2", "dra_pb2_grpc", "pluginregistration_pb2", "pluginregistration_pb2_grpc"]
